#pragma once
// generate's checks of a request, each before the work it guards: the prompts, the --out name, the world size
// a config asks for, a --resume checkpoint against the options given, and the memory the activations need.
#include <memory>
#include <string>
#include <vector>

#include "cli/generate_options.h"
#include "io/checkpoint_file.h"
#include "pipeline/flux_pipeline.h"
#include "runtime/world.h"

namespace dp::cli {

// --resume: reads and validates the checkpoint (a directory: the newest valid one of the run this request
// matches) and fills the options the user did not give from it. Mismatches with the options given are checked
// once the size is resolved.
std::shared_ptr<const io::Checkpoint> read_resume_checkpoint(const GenerateOptions& o,
                                                             const std::vector<std::string>& file_prompts,
                                                             std::string& path);
// The options the user did not give, from the checkpoint's run.
void take_options_from_checkpoint(const io::CheckpointRun& c, GenerateOptions& o);
// After the size is resolved: every option given must match the checkpoint, and so must the model.
void check_resume_matches(const io::Checkpoint& c, const std::string& path, const GenerateOptions& o,
                          const pipeline::GenerateRequest& request, const std::string& dtype,
                          const pipeline::FluxPipeline& flux);

// Prompts are checked as they are read, so that a bad one is named where the user can find it.
void check_prompt_text(const std::string& prompt, const std::string& where);
std::vector<std::string> read_prompts_file(const std::string& path);
// `--prompt a cat on a mat` gives --prompt "a" and four words nobody asked for: refuse rather than guess.
void check_no_stray_words(const GenerateOptions& o);

// --out follows --output-type: out.png or out.h5 by default, and a name that promises the other format is
// refused (an HDF5 file named .png is a wrong result that exits 0). A name without an extension (/dev/null,
// a FIFO) is fine.
std::string output_path_for(const GenerateOptions& o);

// Refuses before any work a request whose activations cannot fit the device's memory, with the estimate.
// `device` is this rank's; `decode` whether this rank decodes (the VAE's rank, for PNG output).
void check_memory(const pipeline::GenerateRequest& request, const std::string& dtype, const pipeline::FluxPipeline& flux,
                  bool decode, const at::Device& device, int64_t microbatch_size);

// A config written for N GPUs (its "ranks") refuses another world size before any file is read: the
// device map, max_memory and the expected speed were chosen for N.
void check_world_size(const GenerateOptions& o, const runtime::World& world);

}  // namespace dp::cli
