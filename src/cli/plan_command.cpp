// `diffpipe plan`: where every module would go, from configs and safetensors headers only (no GPU, no
// weights read): hf_device_map as diffusers/accelerate would compute it, per-device bytes and ranks, and
// predicted stage times of the map next to "balanced" and diffpipe's time-balanced "pipeline".
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "cli/format.h"
#include "core/error.h"
#include "io/run_dtype.h"
#include "placement/plan.h"

namespace dp::cli {
namespace {

struct PlanOptions {
  placement::PlanRequest request;
  std::string max_memory;
  std::string components;
  std::string dtype = "bf16";
  std::string block_times;
  std::string block_times_at = "1024x1024";
  std::string gpu_memory = "141GB";
  std::string cpu_memory = "128GB";
  int world_size = 0;  // read only when --world-size was given
  bool as_json = false;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void parse_resolution(const std::string& text, int64_t* height, int64_t* width) {
  const auto x = text.find('x');
  DP_CHECK(x != std::string::npos && x > 0 && x + 1 < text.size(), "--block-times-at '", text,
           "' must be HEIGHTxWIDTH, as in 1024x1024");
  try {
    *height = std::stoll(text.substr(0, x));
    *width = std::stoll(text.substr(x + 1));
  } catch (const std::exception&) {
    DP_FAIL("--block-times-at '", text, "' must be HEIGHTxWIDTH, as in 1024x1024");
  }
}

std::string device_text(const nlohmann::ordered_json& value) {
  return value.is_number() ? std::to_string(value.get<int>()) : value.get<std::string>();
}

// Groups runs such as transformer_blocks.0 .. transformer_blocks.16 on one device into one line.
void print_map(const nlohmann::ordered_json& map) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& item : map.items()) entries.emplace_back(item.key(), device_text(item.value()));
  auto split_index = [](const std::string& key, std::string* stem, long* index) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos || dot + 1 == key.size()) return false;
    const std::string tail = key.substr(dot + 1);
    if (tail.find_first_not_of("0123456789") != std::string::npos) return false;
    *stem = key.substr(0, dot);
    *index = std::stol(tail);
    return true;
  };
  for (std::size_t i = 0; i < entries.size();) {
    std::string stem, next_stem;
    long first = 0, last = 0, next = 0;
    std::size_t j = i + 1;
    if (split_index(entries[i].first, &stem, &first)) {
      last = first;
      while (j < entries.size() && entries[j].second == entries[i].second &&
             split_index(entries[j].first, &next_stem, &next) && next_stem == stem && next == last + 1) {
        last = next;
        ++j;
      }
    }
    const std::string key = entries[i].first.empty() ? "\"\" (everything)"
                            : j > i + 1 ? stem + "." + std::to_string(first) + "-" + std::to_string(last)
                                        : entries[i].first;
    std::cout << "  " << std::left << std::setw(40) << key << " " << entries[i].second << "\n";
    i = j;
  }
}

std::string bytes_or_dash(const nlohmann::ordered_json& value) {
  return value.is_null() ? "unlimited" : human_bytes(static_cast<uint64_t>(std::max<int64_t>(value.get<int64_t>(), 0)));
}

void print_timing_row(const nlohmann::ordered_json& t) {
  char line[256];
  std::snprintf(line, sizeof(line), "  %-16s %9.2f %9.2f %11.3f %11.1f%%  ", t["strategy"].get<std::string>().c_str(),
                t["max_stage_ms"].get<double>(), t["mean_stage_ms"].get<double>(), t["imbalance"].get<double>(),
                100.0 * t["pipeline_efficiency"].get<double>());
  std::cout << line;
  for (const auto& s : t["stages"]) {
    std::snprintf(line, sizeof(line), " %s:%.1f", device_text(s["device"]).c_str(), s["ms"].get<double>());
    std::cout << line;
  }
  std::cout << "\n";
}

void print_plan(const nlohmann::ordered_json& plan) {
  std::cout << "model: " << plan["model"].get<std::string>() << "  (dtype " << plan["dtype"].get<std::string>()
            << ", world of " << plan["world_size"].get<int>() << " GPU(s))\n";
  std::cout << "max_memory (" << plan["max_memory_from"].get<std::string>() << "):";
  for (const auto& item : plan["max_memory"].items())
    std::cout << " " << item.key() << "=" << human_bytes(item.value().get<uint64_t>());
  std::cout << "\n\ntransformer '" << plan["transformer"]["component"].get<std::string>() << "' ("
            << human_bytes(plan["transformer"]["total_bytes"].get<uint64_t>()) << ") with --device-map "
            << plan["transformer"]["device_map"].get<std::string>() << "\nhf_device_map:\n";
  print_map(plan["hf_device_map"]);

  std::cout << "\ndevices:\n  " << std::left << std::setw(8) << "device" << std::setw(6) << "rank" << std::right
            << std::setw(12) << "weights" << std::setw(12) << "reserved" << std::setw(12) << "budget" << std::setw(12)
            << "free" << "\n";
  for (const auto& d : plan["devices"]) {
    std::cout << "  " << std::left << std::setw(8) << device_text(d["device"]) << std::setw(6)
              << (d["rank"].is_null() ? std::string("-") : std::to_string(d["rank"].get<int>())) << std::right
              << std::setw(12) << human_bytes(d["weights_bytes"].get<uint64_t>()) << std::setw(12)
              << human_bytes(d["reserved_bytes"].get<uint64_t>()) << std::setw(12) << bytes_or_dash(d["budget_bytes"])
              << std::setw(12) << bytes_or_dash(d["free_bytes"]) << (d["offloaded"].get<bool>() ? "  (offloaded)" : "")
              << "\n";
  }

  const auto& cmp = plan["comparison"];
  std::cout << "\npredicted stage times per denoising step at " << cmp["resolution"].get<std::string>() << " ("
            << cmp["timing_source"].get<std::string>() << "):\n"
            << "  strategy           max ms   mean ms   imbalance  efficiency   per GPU (ms)\n";
  print_timing_row(plan["stage_times"]);
  print_timing_row(cmp["balanced"]);
  if (cmp["pipeline"].contains("infeasible"))
    std::cout << "  pipeline         infeasible: " << cmp["pipeline"]["infeasible"].get<std::string>() << "\n";
  else
    print_timing_row(cmp["pipeline"]);

  if (plan.contains("pipeline_hf_device_map")) {
    std::cout << "\npipeline_hf_device_map (pipeline-level \"balanced\"):\n";
    for (const auto& c : plan["components"]) {
      std::cout << "  " << std::left << std::setw(20) << c["component"].get<std::string>() << std::right << std::setw(12)
                << human_bytes(c["bytes"].get<uint64_t>()) << "  " << device_text(c["device"])
                << (c["offloaded"].get<bool>() ? "  (offloaded)" : "") << "\n";
    }
  }
}

void run_plan(PlanOptions& o) {
  auto& r = o.request;
  r.dtype = io::parse_run_dtype(o.dtype);
  if (!o.max_memory.empty()) r.max_memory = placement::read_max_memory_argument(o.max_memory);
  r.pipeline_components = split_commas(o.components);
  r.gpu_memory_bytes = placement::parse_memory_size(o.gpu_memory, "--gpu-memory");
  r.cpu_memory_bytes = placement::parse_memory_size(o.cpu_memory, "--cpu-memory");
  if (!o.block_times.empty()) {
    const auto parts = split_commas(o.block_times);
    DP_CHECK(parts.size() == 2, "--block-times '", o.block_times, "' must be DOUBLE_MS,SINGLE_MS, as in 3.07,2.85");
    try {
      r.timing.double_block_ms = std::stod(parts[0]);
      r.timing.single_block_ms = std::stod(parts[1]);
    } catch (const std::exception&) {
      DP_FAIL("--block-times '", o.block_times, "' must be two numbers of milliseconds, as in 3.07,2.85");
    }
    parse_resolution(o.block_times_at, &r.timing.measured_height, &r.timing.measured_width);
  }
  const auto plan = placement::make_plan(r);
  if (o.as_json) {
    std::cout << plan.dump(2) << "\n";
    return;
  }
  print_plan(plan);
}

CommandRegistrar registrar("plan", 40, [](CLI::App& root) {
  auto* cmd = root.add_subcommand(
      "plan",
      "Show where every module would go: hf_device_map exactly as diffusers/accelerate compute it, per-device\n"
      "bytes and ranks, and predicted stage times next to \"balanced\" and the time-balanced \"pipeline\".\n"
      "Reads config.json files and safetensors headers only: no GPU, no weights.");
  auto o = std::make_shared<PlanOptions>();
  cmd->add_option("--model", o->request.model_dir, "diffusers model folder (or the transformer folder)")->required();
  cmd->add_option("--device-map", o->request.device_map,
                  "transformer placement: auto, balanced, balanced_low_0, sequential (accelerate's), pipeline\n"
                  "(diffpipe's contiguous stages balanced by time), or FILE.json with a custom map such as\n"
                  "{\"transformer_blocks\": 0, \"single_transformer_blocks\": 1}")
      ->capture_default_str();
  cmd->add_option("--pipeline-device-map", o->request.pipeline_device_map,
                  "place whole components too; only \"balanced\" (as diffusers' pipeline-level device_map)");
  cmd->add_option("--components", o->components,
                  "components for --pipeline-device-map, comma-separated (default: every component with weights,\n"
                  "the transformer included, as FluxPipeline.from_pretrained(device_map=\"balanced\"); the guide's\n"
                  "encoders-only step, transformer=None and vae=None, is text_encoder,text_encoder_2)");
  cmd->add_option("--max-memory", o->max_memory,
                  "per-device budgets: 0=16GB,1=16GB,cpu=64GB or FILE.json ({\"0\": \"16GB\"}). GB/MB/KB are powers\n"
                  "of 1000, GiB/MiB/KiB of 1024, plain integers are bytes. Devices left out get nothing.\n"
                  "Default: every GPU of the world at --gpu-memory, plus cpu at --cpu-memory");
  auto* world_size = cmd->add_option(
      "--world-size", o->world_size,
      str("number of GPUs (ranks), 1 to ", placement::kMaxWorldSize,
          "; left out, one past the highest GPU --max-memory names (1 without --max-memory)"));
  cmd->add_option("--height", o->request.timing.height, "image height for activation and time estimates")->capture_default_str();
  cmd->add_option("--width", o->request.timing.width, "image width")->capture_default_str();
  cmd->add_option("--batch", o->request.timing.batch, "images per micro-batch")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "run dtype: bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--block-times", o->block_times,
                  "measured ms per double,single block (H200 bf16 at 1024x1024: 3.07,2.85); default: FLOPs only");
  cmd->add_option("--block-times-at", o->block_times_at, "resolution the block times were measured at")->capture_default_str();
  cmd->add_option("--tflops", o->request.timing.sustained_tflops, "sustained TFLOP/s for the FLOP-only estimate")
      ->capture_default_str();
  cmd->add_option("--gpu-memory", o->gpu_memory, "assumed free memory per GPU without --max-memory")->capture_default_str();
  cmd->add_option("--cpu-memory", o->cpu_memory, "assumed host memory without --max-memory")->capture_default_str();
  cmd->add_flag("--json", o->as_json,
                "print one JSON object (hf_device_map, pipeline_hf_device_map, devices, stage times)");
  cmd->callback([o, world_size] {
    if (world_size->count() > 0) o->request.world_size = o->world_size;
    run_plan(*o);
  });
});

}  // namespace
}  // namespace dp::cli
