#include "io/checkpoint_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_records.h"

namespace dp::io {
namespace {

namespace fs = std::filesystem;
using namespace hdf5;

constexpr int kMaxImages = 4096;
constexpr int kMaxSteps = 100000;

// The scalar attributes, by name, as the file stores them (numbers as doubles, the rest as text).
struct Attributes {
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> texts;
};

Attributes attributes_of(const Checkpoint& c) {
  Attributes a;
  a.texts["format"] = kCheckpointFormatName;
  a.numbers["format_version"] = c.format_version;
  a.numbers["height"] = static_cast<double>(c.run.height);
  a.numbers["width"] = static_cast<double>(c.run.width);
  a.numbers["steps"] = c.run.steps;
  a.numbers["guidance"] = c.run.guidance;
  a.texts["seed"] = std::to_string(c.run.seed);
  a.texts["dtype"] = c.run.dtype;
  a.numbers["num_images_per_prompt"] = c.run.num_images_per_prompt;
  a.numbers["max_sequence_length"] = c.run.max_sequence_length;
  a.numbers["microbatch_size"] = static_cast<double>(c.run.microbatch_size);
  a.numbers["world_size"] = c.world_size;
  a.texts["model"] = c.model_dir;
  a.texts["model_fingerprint"] = c.model_fingerprint;
  a.texts["device_map"] = c.device_map;
  a.texts["written_by"] = c.written_by;
  if (c.format_version >= 2) {
    a.texts["run_id"] = c.run_id;
    a.texts["request_fingerprint"] = c.request_fingerprint;
  }
  if (c.format_version >= 3) {
    a.numbers["true_cfg_scale"] = c.run.true_cfg_scale;
    a.texts["initial_latents"] = c.run.initial_latents;
    a.texts["lora"] = c.run.lora;
    // Only when used, so that the files and digests of runs without it stay as they were.
    if (!c.run.transformer_gemms.empty()) a.texts["transformer_gemms"] = c.run.transformer_gemms;
  }
  return a;
}

std::string content_digest(const Checkpoint& c) {
  Digest d;
  const Attributes a = attributes_of(c);
  for (const auto& [name, value] : a.numbers) d.add(name + "=" + format_double(value));
  for (const auto& [name, value] : a.texts) d.add(name + "=" + value);
  for (const auto& p : c.run.prompts) d.add(p);
  d.add(c.image_steps.data(), c.image_steps.size() * sizeof(int32_t));
  d.add(c.sigmas.data(), c.sigmas.size() * sizeof(float));
  d.add(c.timesteps.data(), c.timesteps.size() * sizeof(float));
  for (const RawTensor* t : {&c.latents, &c.prompt_embeds, &c.pooled}) {
    d.add(t->dtype + shape_text(t->shape));
    d.add(t->data, t->nbytes);
  }
  if (c.format_version >= 3) {
    for (const auto& p : c.run.negative_prompts) d.add(p);
    d.add(c.run.custom_sigmas.data(), c.run.custom_sigmas.size() * sizeof(double));
    for (const RawTensor* t : {&c.negative_prompt_embeds, &c.negative_pooled}) {
      d.add(t->dtype + shape_text(t->shape));
      d.add(t->data, t->nbytes);
    }
  }
  return d.hex();
}

void write_strings(hid_t h5, const std::string& name, const std::vector<std::string>& strings, const std::string& tmp) {
  size_t longest = 1;
  for (const auto& p : strings) longest = std::max(longest, p.size());
  std::string packed(strings.size() * longest, '\0');
  for (size_t i = 0; i < strings.size(); ++i) std::memcpy(&packed[i * longest], strings[i].data(), strings[i].size());
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), longest);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  write_dataset(h5, name, type.get(), type.get(), {static_cast<int64_t>(strings.size())}, packed.data(), tmp);
}

}  // namespace

int64_t RawTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

RawTensor RawTensor::owning(std::string dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  auto holder = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  RawTensor t;
  t.dtype = std::move(dtype);
  t.shape = std::move(shape);
  t.data = holder->data();
  t.nbytes = holder->size();
  t.owner = holder;
  return t;
}

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "fp32") return 4;
  if (dtype == "bf16" || dtype == "fp16") return 2;
  DP_FAIL("unknown checkpoint tensor dtype '", dtype, "' (expected fp32, bf16 or fp16)");
}

bool CheckpointRun::uses_format_3() const {
  return !negative_prompts.empty() || true_cfg_scale != 1.0 || !custom_sigmas.empty() || !initial_latents.empty() ||
         !lora.empty() || !transformer_gemms.empty();
}

int Checkpoint::steps_done() const {
  return image_steps.empty() ? 0 : *std::min_element(image_steps.begin(), image_steps.end());
}

std::string request_fingerprint(const CheckpointRun& run) {
  Digest d;
  d.add(str("request v1: ", run.prompts.size(), " prompts"));
  for (const auto& p : run.prompts) d.add(p);
  d.add(str(run.num_images_per_prompt, " ", run.height, "x", run.width, " ", run.steps, " steps, guidance ",
            format_double(run.guidance), ", seed ", run.seed, ", ", run.max_sequence_length, " tokens, ", run.dtype,
            ", microbatch ", run.microbatch_size));
  // The options of format version 3 count only when used, so version 1 and 2 files keep their fingerprints.
  if (run.uses_format_3()) {
    d.add(str("extras: ", run.negative_prompts.size(), " negative prompts, true cfg ", format_double(run.true_cfg_scale),
              ", ", run.custom_sigmas.size(), " sigmas"));
    for (const auto& p : run.negative_prompts) d.add(p);
    for (double sigma : run.custom_sigmas) d.add(format_double(sigma));
    d.add(run.initial_latents);
    d.add(run.lora);
    if (!run.transformer_gemms.empty()) d.add("transformer gemms " + run.transformer_gemms);
  }
  return d.hex();
}

std::string new_run_id() {
  std::random_device source;
  const uint64_t id = (static_cast<uint64_t>(source()) << 32) ^ source();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(id));
  return text;
}

bool is_run_id(const std::string& id) {
  return id.size() == 16 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

void write_checkpoint(const std::string& path, const Checkpoint& given) {
  hdf5::silence_errors();
  Checkpoint c = given;  // shares the tensors' bytes
  // Version 2 (run identity) unless the run uses version 3's options, so that such runs stay readable by older
  // builds. Version 1 is written only by tests of the reader's compatibility; a version above this build's is
  // kept as asked (tests stand in for a newer writer with it).
  if (c.format_version >= 2 && c.format_version <= kCheckpointFormatVersion)
    c.format_version = c.run.uses_format_3() ? 3 : 2;
  DP_CHECK(c.format_version < 2 || is_run_id(c.run_id), path,
           ": a checkpoint needs a run id (16 hex digits), got '", c.run_id, "'");
  DP_CHECK(c.format_version >= 3 || !c.run.uses_format_3(), path, ": format version ", c.format_version,
           " cannot hold negative prompts, custom sigmas, initial latents or LoRA adapters");
  c.request_fingerprint = request_fingerprint(c.run);
  const int64_t images = static_cast<int64_t>(c.image_steps.size());
  DP_CHECK(images >= 1 && c.latents.shape.size() == 3 && c.latents.shape[0] == images, path,
           ": latents ", shape_text(c.latents.shape), " do not match ", images, " image step indices");
  DP_CHECK(!c.run.prompts.empty(), path, ": a checkpoint needs the prompts");
  AtomicFile output(path);
  output.write([&](const std::string& tmp_file) {
    const std::string& tmp = path;  // the name messages give
    Handle h5(H5Fcreate(tmp_file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    DP_CHECK(h5.ok(), tmp, ": cannot create HDF5 file");
    write_tensor(h5.get(), "latents", c.latents, tmp);
    write_dataset(h5.get(), "image_steps", H5T_STD_I32LE, H5T_NATIVE_INT32, {images}, c.image_steps.data(), tmp);
    write_dataset(h5.get(), "sigmas", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {static_cast<int64_t>(c.sigmas.size())},
                  c.sigmas.data(), tmp);
    write_dataset(h5.get(), "timesteps", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                  {static_cast<int64_t>(c.timesteps.size())}, c.timesteps.data(), tmp);
    write_strings(h5.get(), "prompts", c.run.prompts, tmp);
    write_tensor(h5.get(), "prompt_embeds", c.prompt_embeds, tmp);
    write_tensor(h5.get(), "pooled_prompt_embeds", c.pooled, tmp);
    if (!c.run.negative_prompts.empty()) write_strings(h5.get(), "negative_prompts", c.run.negative_prompts, tmp);
    if (c.negative_prompt_embeds.nbytes > 0) {
      write_tensor(h5.get(), "negative_prompt_embeds", c.negative_prompt_embeds, tmp);
      write_tensor(h5.get(), "negative_pooled_prompt_embeds", c.negative_pooled, tmp);
    }
    if (!c.run.custom_sigmas.empty())
      write_dataset(h5.get(), "custom_sigmas", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                    {static_cast<int64_t>(c.run.custom_sigmas.size())}, c.run.custom_sigmas.data(), tmp);
    const Attributes a = attributes_of(c);
    for (const auto& [name, value] : a.numbers) write_number(h5.get(), name, value, tmp);
    for (const auto& [name, value] : a.texts) write_text(h5.get(), name, value, tmp);
    write_text(h5.get(), "content_digest", content_digest(c), tmp);
    DP_CHECK(H5Fflush(h5.get(), H5F_SCOPE_GLOBAL) >= 0, tmp, ": flush failed");
  });
  output.commit();
}

namespace {

// The attributes, prompts and image steps: everything but the tensors, the schedule and the digest.
Checkpoint read_header(const Reader& r) {
  const std::string& path = r.path;
  DP_CHECK(H5Aexists(r.file, "format") > 0 && r.text("format") == kCheckpointFormatName, path,
           ": not a diffpipe checkpoint (no format attribute '", kCheckpointFormatName, "')");
  Checkpoint c;
  c.format_version = static_cast<int>(r.integer("format_version", 1, 1 << 20));
  DP_CHECK(c.format_version <= kCheckpointFormatVersion, path, ": checkpoint format version ", c.format_version,
           " was written by a newer diffpipe; this build reads format version ", kCheckpointFormatVersion,
           " and older");
  c.run.height = r.integer("height", 1, kMaxDimension);
  c.run.width = r.integer("width", 1, kMaxDimension);
  c.run.steps = static_cast<int>(r.integer("steps", 1, kMaxSteps));
  c.run.guidance = r.number("guidance");
  {
    const std::string seed = r.text("seed");
    DP_CHECK(!seed.empty() && seed.size() <= 20 && seed.find_first_not_of("0123456789") == std::string::npos, path,
             ": attribute 'seed' is '", seed, "', expected a decimal integer");
    errno = 0;
    c.run.seed = std::strtoull(seed.c_str(), nullptr, 10);
    DP_CHECK(errno == 0, path, ": attribute 'seed' ", seed, " is out of range");
  }
  c.run.dtype = r.text("dtype");
  dtype_bytes(c.run.dtype);
  c.run.num_images_per_prompt = static_cast<int>(r.integer("num_images_per_prompt", 1, kMaxImages));
  c.run.max_sequence_length = static_cast<int>(r.integer("max_sequence_length", 1, 1 << 16));
  c.run.microbatch_size = r.integer("microbatch_size", 1, kMaxImages);
  c.world_size = static_cast<int>(r.integer("world_size", 1, 1 << 20));
  c.model_dir = r.text("model");
  c.model_fingerprint = r.text("model_fingerprint");
  c.device_map = r.text("device_map");
  c.written_by = r.text("written_by");
  c.run.prompts = r.strings("prompts");
  const int64_t prompts = static_cast<int64_t>(c.run.prompts.size());
  DP_CHECK(prompts * c.run.num_images_per_prompt <= kMaxImages, path, ": ", prompts, " prompts x ",
           c.run.num_images_per_prompt, " images is implausibly many");
  const int64_t images = prompts * c.run.num_images_per_prompt;
  std::vector<int64_t> shape;
  c.image_steps = as_vector<int32_t>(r.read("image_steps", 1, H5T_INTEGER, 4, H5T_NATIVE_INT32, shape));
  DP_CHECK(shape[0] == images, path, ": 'image_steps' has ", shape[0], " entries for ", images, " images");
  for (size_t i = 0; i < c.image_steps.size(); ++i)
    DP_CHECK(c.image_steps[i] >= 0 && c.image_steps[i] <= c.run.steps, path, ": image ", i, " is at step ",
             c.image_steps[i], " of ", c.run.steps);
  // The options of format version 3 belong to the request: read before its fingerprint is computed.
  if (c.format_version >= 3) {
    c.run.true_cfg_scale = r.number("true_cfg_scale");
    c.run.initial_latents = r.text("initial_latents");
    c.run.lora = r.text("lora");
    if (r.has_attribute("transformer_gemms")) {
      c.run.transformer_gemms = r.text("transformer_gemms");
      DP_CHECK(c.run.fp8_gemms(), path, ": transformer_gemms is '", c.run.transformer_gemms, "' (this build knows \"",
               kFp8TransformerGemms, "\")");
    }
    if (r.has("negative_prompts")) {
      c.run.negative_prompts = r.strings("negative_prompts");
      DP_CHECK(c.run.negative_prompts.size() == 1 || c.run.negative_prompts.size() == c.run.prompts.size(), path,
               ": ", c.run.negative_prompts.size(), " negative prompts for ", c.run.prompts.size(), " prompts");
    }
    if (r.has("custom_sigmas")) {
      std::vector<int64_t> sigma_shape;
      c.run.custom_sigmas = as_vector<double>(r.read("custom_sigmas", 1, H5T_FLOAT, 8, H5T_NATIVE_DOUBLE, sigma_shape));
      DP_CHECK(sigma_shape[0] == c.run.steps, path, ": 'custom_sigmas' has ", sigma_shape[0], " values for ",
               c.run.steps, " steps");
    }
  }
  // The run's identity: stored since format version 2; a version 1 file has no run id, and its request
  // fingerprint follows from the attributes read above.
  c.request_fingerprint = request_fingerprint(c.run);
  if (c.format_version >= 2) {
    c.run_id = r.text("run_id");
    DP_CHECK(is_run_id(c.run_id), path, ": attribute 'run_id' is '", c.run_id, "', expected 16 hex digits");
    const std::string stored = r.text("request_fingerprint");
    DP_CHECK(stored == c.request_fingerprint, path, ": attribute 'request_fingerprint' is ", stored,
             " but the run's options give ", c.request_fingerprint, ": the checkpoint is damaged");
  }
  return c;
}

}  // namespace

Checkpoint read_checkpoint_header(const std::string& path) {
  hdf5::silence_errors();
  DP_CHECK(fs::is_regular_file(path), path, ": no such checkpoint file");
  DP_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file (truncated or damaged checkpoint?)");
  Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DP_CHECK(h5.ok(), path, ": cannot open the HDF5 file (truncated or damaged checkpoint?)");
  return read_header(Reader{path, h5.get()});
}

Checkpoint read_checkpoint(const std::string& path) {
  hdf5::silence_errors();
  DP_CHECK(fs::is_regular_file(path), path, ": no such checkpoint file");
  DP_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file (truncated or damaged checkpoint?)");
  Handle h5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DP_CHECK(h5.ok(), path, ": cannot open the HDF5 file (truncated or damaged checkpoint?)");
  const Reader r{path, h5.get()};
  Checkpoint c = read_header(r);
  const int64_t images = static_cast<int64_t>(c.image_steps.size());
  std::vector<int64_t> shape;
  c.sigmas = as_vector<float>(r.read("sigmas", 1, H5T_FLOAT, 4, H5T_NATIVE_FLOAT, shape));
  DP_CHECK(shape[0] == c.run.steps + 1, path, ": 'sigmas' has ", shape[0], " values for ", c.run.steps, " steps");
  c.timesteps = as_vector<float>(r.read("timesteps", 1, H5T_FLOAT, 4, H5T_NATIVE_FLOAT, shape));
  DP_CHECK(shape[0] == c.run.steps, path, ": 'timesteps' has ", shape[0], " values for ", c.run.steps, " steps");

  c.latents = r.tensor("latents", 3);
  c.prompt_embeds = r.tensor("prompt_embeds", 3);
  c.pooled = r.tensor("pooled_prompt_embeds", 2);
  for (const auto* t : {&c.latents, &c.prompt_embeds, &c.pooled}) {
    DP_CHECK(t->dtype == c.run.dtype, path, ": a tensor is stored as ", t->dtype, " in a ", c.run.dtype, " run");
    DP_CHECK(t->shape[0] == images, path, ": a tensor ", shape_text(t->shape), " has ", t->shape[0], " rows for ",
             images, " images");
  }
  DP_CHECK(c.prompt_embeds.shape[1] == c.run.max_sequence_length, path, ": 'prompt_embeds' ",
           shape_text(c.prompt_embeds.shape), " does not have max_sequence_length ", c.run.max_sequence_length,
           " tokens");
  if (c.format_version >= 3) {
    if (r.has("negative_prompt_embeds")) {
      c.negative_prompt_embeds = r.tensor("negative_prompt_embeds", 3);
      c.negative_pooled = r.tensor("negative_pooled_prompt_embeds", 2);
      DP_CHECK(c.negative_prompt_embeds.shape == c.prompt_embeds.shape && c.negative_pooled.shape == c.pooled.shape &&
                   c.negative_prompt_embeds.dtype == c.run.dtype && c.negative_pooled.dtype == c.run.dtype,
               path, ": the negative prompt embeddings ", shape_text(c.negative_prompt_embeds.shape), " and ",
               shape_text(c.negative_pooled.shape), " do not match the prompts' ", shape_text(c.prompt_embeds.shape),
               " and ", shape_text(c.pooled.shape), " in ", c.run.dtype);
    }
    DP_CHECK(c.run.negative_prompts.empty() == (c.negative_prompt_embeds.nbytes == 0), path,
             ": negative prompts and their embeddings must be stored together");
  }
  const std::string stored_digest = r.text("content_digest");
  const std::string actual_digest = content_digest(c);
  DP_CHECK(stored_digest == actual_digest, path, ": content digest mismatch (stored ", stored_digest, ", contents give ",
           actual_digest, "): the checkpoint is damaged");
  return c;
}

std::string checkpoint_file_name(int steps_done, const std::string& run_id) {
  DP_CHECK(steps_done >= 0 && is_run_id(run_id), "checkpoint name for step ", steps_done, " of run '", run_id, "'");
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-step%06d-%s.h5", steps_done, run_id.c_str());
  return name;
}

std::vector<RunComparison> compare_runs(const CheckpointRun& checkpoint, const CheckpointRun& run,
                                        const std::vector<std::string>& given) {
  const auto is_given = [&](const std::string& field) {
    return std::find(given.begin(), given.end(), field) != given.end();
  };
  std::vector<RunComparison> out;
  const auto compare = [&](const std::string& field, const std::string& a, const std::string& b) {
    if (is_given(field) && a != b) out.push_back({field, a, b});
  };
  const auto prompts_text = [](const std::vector<std::string>& prompts) {
    std::string text;
    for (const auto& p : prompts) text += (text.empty() ? "\"" : ", \"") + p + "\"";
    return text;
  };
  compare("prompts", prompts_text(checkpoint.prompts), prompts_text(run.prompts));
  compare("num-images-per-prompt", std::to_string(checkpoint.num_images_per_prompt),
          std::to_string(run.num_images_per_prompt));
  compare("height", std::to_string(checkpoint.height), std::to_string(run.height));
  compare("width", std::to_string(checkpoint.width), std::to_string(run.width));
  compare("steps", std::to_string(checkpoint.steps), std::to_string(run.steps));
  compare("guidance", format_double(checkpoint.guidance), format_double(run.guidance));
  compare("seed", std::to_string(checkpoint.seed), std::to_string(run.seed));
  compare("max-sequence-length", std::to_string(checkpoint.max_sequence_length),
          std::to_string(run.max_sequence_length));
  compare("dtype", checkpoint.dtype, run.dtype);
  compare("microbatch-size", std::to_string(checkpoint.microbatch_size), std::to_string(run.microbatch_size));
  compare("negative-prompt", prompts_text(checkpoint.negative_prompts), prompts_text(run.negative_prompts));
  compare("true-cfg-scale", format_double(checkpoint.true_cfg_scale), format_double(run.true_cfg_scale));
  const auto sigmas_text = [](const std::vector<double>& sigmas) {
    std::string text;
    for (double s : sigmas) text += (text.empty() ? "" : ",") + format_double(s);
    return text.empty() ? std::string("(default)") : text;
  };
  compare("sigmas", sigmas_text(checkpoint.custom_sigmas), sigmas_text(run.custom_sigmas));
  compare("latents", checkpoint.initial_latents, run.initial_latents);
  compare("lora", checkpoint.lora, run.lora);
  compare("fp8-gemms", checkpoint.fp8_gemms() ? "on" : "off", run.fp8_gemms() ? "on" : "off");
  return out;
}

}  // namespace dp::io
