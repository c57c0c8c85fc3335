// generate's command line: every option with its help text, in the order --help lists them.
#include "cli/generate_options.h"

#include "cli/trace_option.h"
#include "core/error.h"
#include "placement/calibration.h"

namespace dp::cli {

void add_generate_options(CLI::App& cmd, GenerateOptions& o) {
  using Request = pipeline::GenerateRequest;
  cmd.add_option("--config", o.config,
                 "a JSON run config (configs/*.json): its keys are these flags' long names (\"steps\": 50, "
                 "\"device-map\": \"auto\", \"prompt\": [\"a\", \"b\"]); flags on the command line override them. "
                 "An unknown key or a value of the wrong type is an error naming the key and the file");
  cmd.add_option("--ranks", o.ranks,
                 "the number of ranks this run needs (a config states it); checked against the MPI world before "
                 "anything loads (0: any). Start GPU ranks with `mpirun -np N --bind-to none` (or launch/mpirun.sh): "
                 "Open MPI otherwise binds each of two ranks to one core and its weights load at a sixth of the rate")
      ->capture_default_str();
  cmd.add_option("--model", o.model,
                 "diffusers FLUX pipeline folder (model_index.json and components), or a Hugging Face model id "
                 "(black-forest-labs/FLUX.1-dev) already in the local cache (HF_HUB_CACHE, HF_HOME/hub or "
                 "~/.cache/huggingface/hub; nothing is downloaded)")
      ->required();
  cmd.add_flag("--dry-run", o.dry_run,
               "check the request, every path and the model folder's components, print what would run and exit, "
               "without a device or loading any weight");
  cmd.add_option("--revision", o.revision,
                 "with a model id: the branch, tag or commit of the cached snapshot (default: main)");
  cmd.add_option("--prompt", o.prompts,
                 "one prompt (quote it when it has spaces: --prompt \"a cat on a mat\"); repeat for several")
      ->allow_extra_args(false);
  // Catches the words of an unquoted prompt, so that they are refused with a hint instead of becoming prompts.
  cmd.add_option("stray-words", o.stray_words)->group("");
  cmd.add_option("--prompts-file", o.prompts_file,
                 "file with one prompt a line (blank lines skipped); with --lora-mode unfused a line (or a --prompt) "
                 "may start with <lora:NAME> or <lora:NAME:SCALE> tags choosing its adapters (<lora:none>: none)");
  cmd.add_option("--num-images-per-prompt", o.num_images_per_prompt,
                 str("images per prompt; at most ", Request::kMaxImages, " images per run (prompts x this)"))
      ->capture_default_str();
  cmd.add_option("--height", o.height,
                 "image height in pixels (default: from the model, 128 x the VAE's scale factor: 1024 for FLUX.1); "
                 "a multiple of 2 x that factor (16 for FLUX.1), else rounded down with a warning, as diffusers; "
                 + str("at most ", Request::kMaxImageSide));
  cmd.add_option("--width", o.width, "image width in pixels (default, rounding and limit as --height)");
  cmd.add_option("--steps,--num-inference-steps", o.steps,
                 str("denoising steps, 1 to ", Request::kMaxSteps, " (--num-inference-steps: diffusers' name)"))->capture_default_str();
  cmd.add_option("--guidance,--guidance-scale", o.guidance,
                 "guidance scale, a finite number (used when the transformer has a guidance embedding; "
                 "--guidance-scale: diffusers' name)")
      ->capture_default_str();
  cmd.add_option("--seed", o.seed, "seed of the CPU generator that draws the initial latents")->capture_default_str();
  cmd.add_option("--max-sequence-length", o.max_sequence_length, "T5 tokens, at most 512")->capture_default_str();
  cmd.add_option("--dtype,--torch-dtype", o.dtype,
                 "fp32, bf16 or fp16 (also as torch names: torch.bfloat16, bfloat16, float16, float32); default fp32 on cpu (bf16 is many times slower there), bf16 on cuda");
  cmd.add_option("--device", o.device, "auto (cuda when a GPU is visible, else cpu), cpu or cuda")
      ->capture_default_str();
  cmd.add_option("--out", o.out,
                 "output path, default out.png (out.h5 with --output-type latent); its extension must match "
                 "--output-type. Several images are written as PATH-0.png, PATH-1.png ... (all images of the first "
                 "prompt first). A regular file or a new one (never through a symbolic link: a link is refused); "
                 "/dev/null discards them all; a FIFO or other device is refused");
  cmd.add_option("--output-type", o.output_type,
                 "png (or pil, diffusers' name for it), or latent: packed latents (B, seq, 64) float32 in an HDF5 file, "
                 "dataset 'latents'")
      ->capture_default_str();
  cmd.add_option("--report-json", o.report_json,
                 "also write per-stage times (with the part spent loading weights), peak memory and step times "
                 "as JSON to this file");
  cmd.add_option("--device-map", o.runtime.device_map,
                 "how the transformer's blocks are split over the ranks (GPU d of the map is rank d): auto, "
                 "balanced, balanced_low_0, sequential, pipeline or a JSON map, as `plan` takes it (default: "
                 "pipeline, the time-balanced split over all ranks)");
  cmd.add_option("--max-memory", o.runtime.max_memory,
                 "memory per device for planning, as `plan` takes it (0=16GB,1=16GB,cpu=64GB or a JSON file)");
  cmd.add_option("--load-overlap", o.runtime.load_overlap,
                 "load this rank's transformer blocks on a thread while its text encoders run, within the staged "
                 "order's peak memory: on, off, or auto (the staged order: the overlap measured no faster on an "
                 "H200; the log says which and why)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd.add_flag("--fp8-gemms", o.runtime.fp8_gemms,
               "run the transformer blocks' projections as FP8 GEMMs (e4m3, a scale per weight channel and per "
               "token; needs compute capability 8.9+ and bf16): a 1024x1024 FLUX.1-dev step took 102 ms against "
               "126 ms on an H100 (peak 24.1 GB against 24.3), at some cost in fidelity (47 dB from diffusers' "
               "bf16 image on random weights; measure on yours). Blocks offloaded by the device map stay bf16. "
               "Also DIFFPIPE_FP8_GEMMS=1");
  cmd.add_flag("--no-warm-up", o.no_warm_up,
               "skip running one transformer block of each kind, and the loop's own kernels (timestep rows, Euler "
               "step, finite check), on zeros while or after loading (they ready the kernels and cuBLAS handles, so "
               "that the first denoising step costs what later ones do)");
  cmd.add_option("--pipeline-device-map", o.runtime.pipeline_device_map,
                 "which ranks run CLIP, T5 and the VAE: only \"balanced\", diffusers' pipeline-level map, placed with "
                 "--max-memory as `plan --pipeline-device-map balanced --components text_encoder,text_encoder_2,vae` "
                 "shows it (GPU d is rank d; \"cpu\" is the coordinator on its CPU). Default: rank 0 runs all three");
  cmd.add_option("--microbatch-size", o.runtime.microbatch_size,
                 "images per microbatch in the denoising ring; with several microbatches every rank is busy "
                 "(latents equal for any world size at the same microbatch size). 0: choose the size with the most "
                 "simulated images/s for the images, ranks and --max-memory, from the calibration's times and "
                 "microbatch efficiency curve when one matches (else FLOP-scaled times and a stated default curve); "
                 "the log says which and why")
      ->capture_default_str();
  cmd.add_option("--calibration", o.runtime.calibration,
                 "block times written by `diffpipe calibrate`: the \"pipeline\" split is planned from them when an "
                 "entry matches this run (each rank's device name, dtype, size, text tokens, microbatch size); "
                 "otherwise from FLOP-scaled times, and the log says why (default: " +
                     placement::default_calibration_path() + " when it exists)");
  cmd.add_flag("--calibrate-on-load", o.runtime.calibrate_on_load,
               "before the ranks load their blocks, rank 0 times one double and one single block, the embedders and "
               "the output layers on its device at this run's shape and microbatch size (at most 2 s), and every "
               "rank re-plans the \"pipeline\" split from those times (replacing any --calibration) and agrees on it");
  cmd.add_flag("--no-calibration", o.runtime.no_calibration,
               "plan the \"pipeline\" split from FLOP-scaled times even when a calibration matches");
  cmd.add_option("--sequence-parallel", o.runtime.sequence_parallel,
                 "K ranks per pipeline stage that split each image's text and image tokens (Ulysses: an all-to-all "
                 "around every attention, exact). The world is a mesh of S stage groups x K ranks (world size = "
                 "S x K, rank = group x K + k); --device-map, --max-memory and --pipeline-device-map plan the S groups "
                 "(GPU d is group d). K must divide the world and the transformer's attention heads and leave every "
                 "rank a token; a refusal names the valid values. 1: the plain pipeline ring")
      ->capture_default_str();
  cmd.add_option("--transport-timeout", o.runtime.transport_timeout_seconds,
                 "seconds a rank waits for any one message before it ends the job (a dead or unreachable rank); a "
                 "positive, finite number")
      ->capture_default_str();
  cmd.add_option("--transport", o.runtime.transport,
                 "how activations move between ranks: nccl (GPU to GPU with NCCL on a stream of their own, "
                 "--device cuda only, in a build with NCCL), mpi (staged through host memory; CPU runs, CI) or "
                 "auto (nccl when the device is cuda, this build has NCCL and there are several ranks; else mpi). "
                 "Control messages always go over MPI; every rank must choose the same")
      ->capture_default_str();
  add_trace_options(cmd, o.runtime);
  cmd.add_option("--report", o.runtime.report_path,
                 "each rank writes its figures as JSON (rank, transport, blocks, load time, peak memory, bytes to "
                 "and from its neighbours, compute/receive/send/idle seconds in total and per step; on cuda compute "
                 "is device time from CUDA events, and so are send/receive over nccl); with N > 1 ranks beside PATH "
                 "as PATH.rankR.json");
  cmd.add_option("--checkpoint-dir", o.runtime.checkpoints.dir,
                 "write denoising checkpoints (HDF5, atomically) into this directory as checkpoint-stepNNNNNN-RUNID.h5: "
                 "every --checkpoint-every steps, and on SIGUSR1 or SIGTERM to any rank at the next step boundary, "
                 "after which every rank stops with exit status 75. A directory holding another run's checkpoints "
                 "is refused unless --resume or --share-checkpoint-dir");
  cmd.add_option("--checkpoint-every", o.runtime.checkpoints.every,
                 "steps between checkpoints (0: only on a stop signal)")->capture_default_str();
  cmd.add_option("--keep-checkpoints", o.runtime.checkpoints.keep,
                 "keep the newest N checkpoints of this run (older ones of this run are removed, each logged; other "
                 "runs' files never are)")
      ->capture_default_str();
  cmd.add_flag("--share-checkpoint-dir", o.runtime.checkpoints.share_dir,
               "let --checkpoint-dir hold other runs' checkpoints: this run writes beside them under its own run "
               "id and never replaces or removes theirs (without it such a directory is refused, unless --resume)");
  cmd.add_option("--resume", o.resume,
                 "continue from a checkpoint file, or a directory: the newest valid checkpoint of the one run there "
                 "that this request matches (same model, and the options given); several matching runs are listed "
                 "and refused. Options not given are taken from it, those given must match it (any world size and "
                 "device map)");
  add_generate_input_options(cmd, o.inputs);
  cmd.add_option("--embeddings-cache", o.runtime.checkpoints.embeddings_cache,
                 "HDF5 file of prompt embeddings keyed by prompt, max sequence length, dtype and the text "
                 "encoders' fingerprint: prompts found there skip CLIP and T5, new ones are added. Only a new file "
                 "or a cache diffpipe wrote is (re)written; any other file is refused");
  cmd.footer(
      "Checked before any work: every path (outputs writable regular files or new ones, never through a\n"
      "symbolic link; no FIFO or device but /dev/null; no two of the run's paths one file; nothing written into\n"
      "the model folder; the embeddings cache a cache; no other run's checkpoints in --checkpoint-dir), the\n"
      "limits above, and the memory the activations need (estimated from the configs) against what the device\n"
      "has free. Files are written whole (a temporary renamed over the name) or not at all; a full disk is\n"
      "named (ENOSPC, EDQUOT).\n\n"
      "Exit status: 0 done; 1 runtime error (the work started and failed); 2 usage error (the command line\n"
      "cannot be parsed); 3 input error (refused before any work: a bad folder, file or value, not enough\n"
      "memory); 75 (EX_TEMPFAIL) stopped by SIGUSR1/SIGTERM (to any rank) after writing a checkpoint into\n"
      "--checkpoint-dir (every rank; mpirun too for SIGUSR1, while Open MPI's mpirun exits 1 on its own\n"
      "SIGTERM): requeue the job with --resume DIR.");
}

}  // namespace dp::cli
