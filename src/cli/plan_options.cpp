// plan's command line: every option with its help text, in the order --help lists them.
#include "cli/plan_options.h"

#include "core/error.h"
#include "placement/calibration.h"
#include "placement/ring_simulator.h"

namespace dp::cli {

void add_plan_options(CLI::App& cmd, PlanOptions& o) {
  o.request.device_map = "pipeline";  // generate's default: plan shows what a plain generate would run
  cmd.add_option("--model", o.request.model_dir,
                 "diffusers model folder (or the transformer folder), or a Hugging Face model id in the local cache")
      ->required();
  cmd.add_option("--revision", o.revision, "with a model id: branch, tag or commit of the cached snapshot (main)");
  cmd.add_option("--device-map", o.request.device_map,
                 "transformer placement: auto, balanced, balanced_low_0, sequential (accelerate's), pipeline\n"
                 "(diffpipe's contiguous stages balanced by time; generate's default too), or FILE.json with a\n"
                 "custom map such as {\"transformer_blocks\": 0, \"single_transformer_blocks\": 1}")
      ->capture_default_str();
  cmd.add_option("--pipeline-device-map", o.request.pipeline_device_map,
                 "place whole components too; only \"balanced\" (as diffusers' pipeline-level device_map)");
  cmd.add_option("--components", o.components,
                 "components for --pipeline-device-map, comma-separated (default: every component with weights,\n"
                 "the transformer included, as FluxPipeline.from_pretrained(device_map=\"balanced\"); the guide's\n"
                 "encoders-only step, transformer=None and vae=None, is text_encoder,text_encoder_2)");
  cmd.add_option("--max-memory", o.max_memory,
                 "per-device budgets: 0=16GB,1=16GB,cpu=64GB or FILE.json ({\"0\": \"16GB\"}). GB/MB/KB are powers\n"
                 "of 1000, GiB/MiB/KiB of 1024, plain integers are bytes. Devices left out get nothing.\n"
                 "Default: every GPU of the world at --gpu-memory, plus cpu at --cpu-memory");
  cmd.add_option("--world-size", o.world_size,
                 str("number of GPUs (ranks), 1 to ", placement::kMaxWorldSize,
                     "; left out, one past the highest GPU --max-memory names (1 without --max-memory)"));
  cmd.add_option("--height", o.request.timing.height, "image height for activation and time estimates")->capture_default_str();
  cmd.add_option("--width", o.request.timing.width, "image width")->capture_default_str();
  auto* batch = cmd.add_option("--batch", o.request.timing.batch, "images per micro-batch")->capture_default_str();
  cmd.add_option("--dtype,--torch-dtype", o.dtype,
                 "run dtype: bf16, fp16 or fp32 (default as generate picks it: bf16 on cuda, fp32 on cpu)");
  cmd.add_option("--device", o.device,
                 "the device generate will run on, for the default --dtype: cuda (default: plan places GPUs, often\n"
                 "from a machine without one) or cpu")
      ->capture_default_str();
  cmd.add_option("--block-times", o.block_times,
                 "measured ms per double,single block (H200 bf16 at 1024x1024: 3.07,2.85); default: FLOPs only");
  cmd.add_option("--block-times-at", o.block_times_at, "resolution the block times were measured at")->capture_default_str();
  cmd.add_option("--calibration", o.calibration,
                 "block times written by `diffpipe calibrate`: used when an entry matches the dtype, --height,\n"
                 "--width, --text-tokens and --microbatch-size (default: " + placement::default_calibration_path() +
                     " when it exists)");
  cmd.add_option("--calibration-device", o.calibration_device,
                 "the device whose calibration to plan from (a GPU name as calibrate wrote it; needed when the\n"
                 "file has entries of several devices for this run)");
  cmd.add_flag("--no-calibration", o.no_calibration, "plan from FLOP-scaled times even when a calibration matches");
  cmd.add_option("--text-tokens", o.request.timing.text_tokens, "text tokens (T5 max_sequence_length)")
      ->capture_default_str();
  cmd.add_option("--tflops", o.request.timing.sustained_tflops, "sustained TFLOP/s for the FLOP-only estimate")
      ->capture_default_str();
  cmd.add_flag("--cuda-caps", o.request.cuda_caps,
               "plan as `generate --device cuda --max-memory` does, where max_memory also caps each rank's CUDA\n"
               "allocator: auto/balanced/sequential place weights in each GPU's max_memory less the activations,\n"
               "the allocator reserve and two streamed blocks (without it: exactly accelerate's map)");
  cmd.add_flag("--fp8-gemms", o.request.fp8_gemms,
               "plan as `generate --fp8-gemms` does: the blocks' projections sized as FP8 (a byte an element), so\n"
               "more blocks share a GPU; a plan that would offload blocks is made at the run dtype instead");
  cmd.add_option("--gpu-memory", o.gpu_memory,
                 "assumed free memory per GPU without --max-memory, and each GPU's memory in --simulate-sweep")
      ->capture_default_str();
  cmd.add_option("--cpu-memory", o.cpu_memory, "assumed host memory without --max-memory")->capture_default_str();
  cmd.add_flag("--json", o.as_json,
               "print one JSON object (hf_device_map, pipeline_hf_device_map, devices, ranks, stage times, and\n"
               "the simulation when asked for)");
  // The simulator: placement/ring_simulator.h.
  cmd.add_flag("--simulate", o.simulate,
               "replay the denoising ring of this map, \"balanced\" and \"pipeline\" on paper: images/s, one-prompt\n"
               "latency, bubble (idle share of stage time), busy share per stage and bytes on every link");
  cmd.add_flag("--simulate-sweep", o.sweep,
               "also simulate the \"pipeline\" split on N = 1, 2, 4 ... 64 GPUs (and --world-size) for 1, N and 4N\n"
               "prompts, and every mesh of S stage groups x K sequence-parallel ranks = the world: one image's\n"
               "latency and --prompts' throughput (default 4N), the best of each marked; each GPU at --gpu-memory");
  cmd.add_option(
      "--sequence-parallel", o.simulation.sequence_parallel,
      "K: the world (--world-size) is S = N / K pipeline stage groups of K ranks that split each image's tokens\n"
      "(Ulysses all-to-alls around attention); maps and stage times are then per stage group and per rank");
  cmd.add_option("--gpus-per-node", o.simulation.gpus_per_node,
                 "GPUs per node: a sequence group across nodes sends its cross-node all-to-all share over ib")
      ->capture_default_str();
  cmd.add_option("--link", o.simulation.link, "link between ring neighbours:\n" + placement::link_presets_help())
      ->capture_default_str();
  cmd.add_option("--link-gbps", o.simulation.link_gbps, "link bandwidth in GB/s (one direction), replacing --link's");
  cmd.add_option("--link-latency-us", o.simulation.link_latency_us, "latency of one message in microseconds, replacing --link's");
  cmd.add_flag("--no-overlap", o.simulation.no_overlap,
               "a rank waits for its sends to finish before computing again (the runtime overlaps them)");
  cmd.add_option("--prompts", o.simulation.prompts, "prompts to simulate (default: 1, N and 4N for a world of N)");
  cmd.add_option("--images-per-prompt,--num-images-per-prompt", o.simulation.images_per_prompt, "images per prompt")
      ->capture_default_str();
  cmd.add_option("--microbatch-size", o.microbatch_size,
                 "images per microbatch, as generate's option; also the --batch the plan is made for")
      ->excludes(batch);
  cmd.add_option("--steps", o.simulation.steps, "denoising steps")->capture_default_str();
  cmd.add_option("--euler-ms", o.simulation.euler_ms,
                 "rank 0's time per microbatch step for the Euler update and the loop (an estimate; --report measures it)")
      ->capture_default_str();
  cmd.add_option("--max-in-flight", o.simulation.max_in_flight,
                 "steps in flight at once (default: one per ring stage, as the runtime); more hides transfer time");
  cmd.add_option("--stage-ms", o.stage_ms,
                 "replace the planned compute time of each ring stage of this map (ms per microbatch step, in ring\n"
                 "order), e.g. measured ones from generate --report");
}

void note_given_plan_options(const CLI::App& cmd, PlanOptions& o) {
  if (cmd.count("--world-size") > 0) o.request.world_size = o.world_size;
  o.sequence_parallel_given = cmd.count("--sequence-parallel") > 0;
  o.prompts_given = cmd.count("--prompts") > 0;
  o.microbatch_given = cmd.count("--microbatch-size") > 0;
  o.batch_given = cmd.count("--batch") > 0;
}

}  // namespace dp::cli
