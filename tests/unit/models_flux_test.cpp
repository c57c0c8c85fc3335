// FluxTransformer against diffusers (the oracle in tests/reference/cases_flux.py), and the property the
// pipeline runtime stands on: any split of the blocks across instances gives the same output as no split.
#include <gtest/gtest.h>

#include <c10/core/InferenceMode.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "io/parallel_load.h"
#include "io/safetensors_writer.h"
#include "io/torch_tensors.h"
#include "models/flux/flux_fused.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/fp8_gemm.h"
#include "placement/flux_module_tree.h"
#include "test_support.h"

namespace dp::models {
namespace {

const std::vector<std::string> kCases = {"guidance_nonsquare", "no_guidance_batch2", "dev_like"};

struct OracleCase {
  std::string transformer_dir;
  FluxInputs inputs;
  at::Tensor expected_fp32, expected_bf16;
  // diffusers' fp32 and bf16 models with the FP8 definition in their block projections
  at::Tensor expected_fp8_fp32, expected_fp8;
};

OracleCase load_case(const std::string& name) {
  const std::string dir = dp::test::reference_dir() + "/flux/" + name;
  auto file = io::SafetensorsFile::open(dir + "/io.safetensors");
  auto get = [&](const std::string& key) -> at::Tensor {
    const auto* info = file->find(key);
    return info == nullptr ? at::Tensor() : io::tensor_view(file, *info).clone();
  };
  OracleCase c;
  c.transformer_dir = dir + "/transformer";
  c.inputs.hidden_states = get("input.hidden_states");
  c.inputs.encoder_hidden_states = get("input.encoder_hidden_states");
  c.inputs.pooled_projections = get("input.pooled_projections");
  c.inputs.timestep = get("input.timestep");
  c.inputs.img_ids = get("input.img_ids");
  c.inputs.txt_ids = get("input.txt_ids");
  c.inputs.guidance = get("input.guidance");
  c.expected_fp32 = get("output.fp32");
  c.expected_bf16 = get("output.bf16");
  c.expected_fp8_fp32 = get("output.fp8_fp32");
  c.expected_fp8 = get("output.fp8");
  return c;
}

// A case's transformer as FluxTransformer::load(weights, config, ...) takes it: its config and its weight index.
struct CaseWeights {
  FluxConfig config;
  std::shared_ptr<const io::WeightIndex> weights;
};
CaseWeights case_weights(const OracleCase& c) {
  const std::string config_path = c.transformer_dir + "/config.json";
  return {FluxConfig::from_json(read_json_file(config_path), config_path),
          std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(c.transformer_dir))};
}

FluxInputs cast_inputs(const FluxInputs& in, at::ScalarType dtype) {
  FluxInputs out = in;
  out.hidden_states = in.hidden_states.to(dtype);
  out.encoder_hidden_states = in.encoder_hidden_states.to(dtype);
  out.pooled_projections = in.pooled_projections.to(dtype);
  return out;
}

FluxInputs to_device(const FluxInputs& in, const at::Device& device) {
  FluxInputs out = in;
  for (at::Tensor* t : {&out.hidden_states, &out.encoder_hidden_states, &out.pooled_projections, &out.timestep,
                        &out.img_ids, &out.txt_ids, &out.guidance})
    if (t->defined()) *t = t->to(device);
  return out;
}

double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  const double scale = expected.abs().max().item<double>();
  return (actual.to(at::kFloat) - expected).abs().max().item<double>() / scale;
}

class FluxOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(FluxOracle, Fp32MatchesDiffusers) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto model = FluxTransformer::load(c.transformer_dir, at::kFloat, at::kCPU);
  const at::Tensor out = model.forward(c.inputs);
  ASSERT_EQ(out.sizes(), c.expected_fp32.sizes());
  const double err = relative_error(out, c.expected_fp32);
  RecordProperty("fp32_relative_error", std::to_string(err));
  // Same ops in the same order on the same ATen: only threading and summation order can differ.
  EXPECT_LE(err, 1e-4) << GetParam();
  std::cout << GetParam() << ": fp32 relative error vs diffusers " << err << "\n";
}

TEST_P(FluxOracle, Bf16MatchesDiffusers) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto model = FluxTransformer::load(c.transformer_dir, at::kBFloat16, at::kCPU);
  const at::Tensor out = model.forward(cast_inputs(c.inputs, at::kBFloat16));
  ASSERT_EQ(out.scalar_type(), at::kBFloat16);
  const double err = relative_error(out, c.expected_bf16);
  // bf16 keeps 8 mantissa bits (epsilon 2^-8 = 0.0039 relative per rounding). The output passes through
  // dozens of rounded ops, so a differing reduction order can move an element by a few ulps of the output
  // scale. Measured: about one ulp (0.004-0.005); 1.6e-2 allows four ulps and still catches any real
  // numerical mistake, which shows up as O(1) error.
  EXPECT_LE(err, 1.6e-2) << GetParam();
  std::cout << GetParam() << ": bf16 relative error vs diffusers bf16 " << err << "\n";
}

TEST_P(FluxOracle, Fp16RunsAndTracksFp32) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto model = FluxTransformer::load(c.transformer_dir, at::kHalf, at::kCPU);
  const at::Tensor out = model.forward(cast_inputs(c.inputs, at::kHalf));
  ASSERT_EQ(out.scalar_type(), at::kHalf);
  // fp16 has 11 mantissa bits but the timestep is rounded to fp16 before embedding, so compare loosely.
  EXPECT_LE(relative_error(out, c.expected_fp32), 5e-2) << GetParam();
}

// Runs the model as a chain of stage instances, each loaded with only its own parts.
at::Tensor run_split(const std::string& dir, const FluxInputs& inputs, const std::vector<int64_t>& cuts) {
  const std::string config_path = dir + "/config.json";
  const FluxConfig config = FluxConfig::from_json(read_json_file(config_path), config_path);
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  std::vector<int64_t> bounds = {0};
  bounds.insert(bounds.end(), cuts.begin(), cuts.end());
  bounds.push_back(config.num_blocks());
  FluxActivations state;
  flux::RotaryTables rope;
  at::Tensor out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    FluxParts parts{s == 0, bounds[s], bounds[s + 1], s + 2 == bounds.size()};
    const auto stage = FluxTransformer::load(weights, config, at::kFloat, at::kCPU, parts);
    if (parts.embedders) state = stage.embed(inputs);
    rope = stage.rotary(inputs.txt_ids, inputs.img_ids);  // every rank recomputes its own tables
    stage.run_blocks(state, rope, bounds[s], bounds[s + 1]);
    if (parts.head) out = stage.head(state);
  }
  return out;
}

TEST_P(FluxOracle, AnySplitEqualsNoSplit) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto whole = FluxTransformer::load(c.transformer_dir, at::kFloat, at::kCPU).forward(c.inputs);
  const int64_t blocks =
      FluxTransformer::load(c.transformer_dir, at::kFloat, at::kCPU, FluxParts{false, 0, 0, false}).config().num_blocks();
  // Every single cut point (including the double/single boundary and empty stages at both ends).
  for (int64_t cut = 0; cut <= blocks; ++cut) {
    EXPECT_TRUE(at::equal(run_split(c.transformer_dir, c.inputs, {cut}), whole)) << GetParam() << " cut " << cut;
  }
  // A stage per block.
  std::vector<int64_t> every;
  for (int64_t b = 1; b < blocks; ++b) every.push_back(b);
  EXPECT_TRUE(at::equal(run_split(c.transformer_dir, c.inputs, every), whole)) << GetParam();
}

// The modulation table (FluxTransformer::modulation_table): a step's rows from it give, bit for bit, what the blocks
// compute from that step's temb (on CUDA the kernel's rows do not depend on how many come together; elsewhere the
// table runs the layer a step at a time). Another step's rows must change the output, or the table was never read.
void expect_table_gives_the_steps_rows(const OracleCase& c, at::Device device) {
  const auto model = FluxTransformer::load(c.transformer_dir, at::kFloat, device);
  const FluxInputs in = to_device(c.inputs, device);
  const int64_t batch = in.hidden_states.size(0);
  std::vector<at::Tensor> tembs;
  for (const double t : {1.0, 0.6, 0.25})
    tembs.push_back(model.embed_time(at::full({batch}, t, at::TensorOptions().device(device)), in.guidance,
                                     in.pooled_projections));
  const ModulationTable table = model.modulation_table(tembs);
  const FluxConfig& config = model.config();
  EXPECT_EQ(static_cast<int64_t>(table.blocks.size()), config.num_blocks());
  const int64_t widths = 12 * config.num_layers + 3 * (config.num_blocks() - config.num_layers);
  EXPECT_EQ(table.nbytes(), static_cast<uint64_t>(3 * batch * widths * config.inner_dim() * 4));
  const auto rope = model.rotary(in.txt_ids, in.img_ids);
  const auto run = [&](const ModulationTable* rows, int64_t step) {
    FluxActivations state{model.embed_image(in.hidden_states), model.embed_text(in.encoder_hidden_states), tembs[1]};
    model.run_blocks(state, rope, 0, config.num_blocks(), nullptr, rows, step);
    return model.head(state).cpu();
  };
  const at::Tensor plain = run(nullptr, 1);
  const at::Tensor from_table = run(&table, 1);
  EXPECT_TRUE(at::equal(from_table, plain)) << "max difference " << (from_table - plain).abs().max().item<double>();
  EXPECT_GT(relative_error(run(&table, 2), plain), 1e-3) << "another step's rows changed nothing";
  FluxActivations wrong_rows{model.embed_image(in.hidden_states), model.embed_text(in.encoder_hidden_states),
                             at::cat({tembs[1], tembs[1]}, 0)};
  EXPECT_THROW(model.run_blocks(wrong_rows, rope, 0, 1, nullptr, &table, 1), Error);
}

TEST_P(FluxOracle, ModulationTableGivesTheStepsRowsBitForBit) {
  c10::InferenceMode guard;
  expect_table_gives_the_steps_rows(load_case(GetParam()), at::kCPU);
}

INSTANTIATE_TEST_SUITE_P(Oracle, FluxOracle, ::testing::ValuesIn(kCases));

// --fp8-gemms against its definition run by diffusers (cases_flux.py), in root-mean-square relative errors. A
// rounding to e4m3 is 16 times coarser than one to bf16, so where an input differs by one bf16 ulp its FP8 value
// may flip a whole step: the tight comparison is in fp32 on the CPU (the definition holds for any dtype there),
// and in bf16 the output must be nearer the FP8 reference than the unquantised one. Where no projection is a
// multiple of 16 wide (no_guidance_batch2) nothing converts and the references are equal.
struct Fp8Errors {
  double to_fp8 = 0, to_unquantised = 0;
};

double rms_relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor difference = actual.to(at::kDouble) - expected.to(at::kDouble);
  return difference.pow(2).mean().sqrt().item<double>() / expected.to(at::kDouble).pow(2).mean().sqrt().item<double>();
}

Fp8Errors fp8_forward_errors(const OracleCase& c, at::ScalarType dtype, at::Device device) {
  flux::set_fp8_gemms_enabled(true);
  const auto model = FluxTransformer::load(c.transformer_dir, dtype, device);
  flux::set_fp8_gemms_enabled(false);
  const at::Tensor out = model.forward(to_device(cast_inputs(c.inputs, dtype), device)).cpu();
  const bool fp32 = dtype == at::kFloat;
  return {rms_relative_error(out, fp32 ? c.expected_fp8_fp32 : c.expected_fp8),
          rms_relative_error(out, fp32 ? c.expected_fp32 : c.expected_bf16)};
}

void expect_fp8_errors(const Fp8Errors& e, const at::Tensor& fp8_reference, const at::Tensor& unquantised,
                       double bound) {
  EXPECT_LE(e.to_fp8, bound);
  if (!at::equal(fp8_reference, unquantised)) {
    EXPECT_LT(e.to_fp8, e.to_unquantised) << "nearer the unquantised output: were the projections converted?";
  }
}

TEST_P(FluxOracle, Fp8GemmsMatchTheirDefinition) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const Fp8Errors e = fp8_forward_errors(c, at::kFloat, at::kCPU);
  std::cout << GetParam() << ": --fp8-gemms on the CPU in fp32, rms relative error to the FP8 reference " << e.to_fp8
            << ", to fp32 " << e.to_unquantised << "\n";
  expect_fp8_errors(e, c.expected_fp8_fp32, c.expected_fp32, 1e-4);  // as the fp32 oracle: summation order only
  const Fp8Errors bf16 = fp8_forward_errors(c, at::kBFloat16, at::kCPU);
  std::cout << GetParam() << ": the same in bf16: " << bf16.to_fp8 << " to the FP8 reference, " << bf16.to_unquantised
            << " to bf16\n";
  expect_fp8_errors(bf16, c.expected_fp8, c.expected_bf16, 2e-2);
}

// The same oracle on the GPU. CI machines have none, so these skip there; bench/gpu.sh sets
// DIFFPIPE_REQUIRE_CUDA=1, which turns a missing GPU into a failure.
class FluxOracleCuda : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DP_TEST_NEED_CUDA(); }
};


TEST_P(FluxOracleCuda, ModulationTableGivesTheStepsRowsBitForBit) {
  c10::InferenceMode guard;
  flux::set_modulation_table_override(true);
  expect_table_gives_the_steps_rows(load_case(GetParam()), at::kCUDA);
  flux::set_modulation_table_override(std::nullopt);
}

TEST_P(FluxOracleCuda, Fp32MatchesDiffusers) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto model = FluxTransformer::load(c.transformer_dir, at::kFloat, at::kCUDA);
  const double err = relative_error(model.forward(to_device(c.inputs, at::kCUDA)).cpu(), c.expected_fp32);
  std::cout << GetParam() << ": CUDA fp32 relative error vs diffusers CPU fp32 " << err << "\n";
  // cuBLAS and the SDPA kernels reduce in another order than the CPU, TF32 stays off: 1e-4 as on CPU.
  EXPECT_LE(err, 1e-4);
}

TEST_P(FluxOracleCuda, Bf16MatchesDiffusers) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const auto model = FluxTransformer::load(c.transformer_dir, at::kBFloat16, at::kCUDA);
  const at::Tensor out = model.forward(to_device(cast_inputs(c.inputs, at::kBFloat16), at::kCUDA)).cpu();
  const double err = relative_error(out, c.expected_bf16);
  std::cout << GetParam() << ": CUDA bf16 relative error vs diffusers CPU bf16 " << err << "\n";
  // Flash attention and cuBLAS bf16 kernels round intermediate results differently from the CPU kernels,
  // so allow eight bf16 ulps of the output scale (3.2e-2); a wrong formula gives errors of order one.
  EXPECT_LE(err, 3.2e-2);
}

TEST_P(FluxOracleCuda, Fp8GemmsMatchTheirDefinition) {
  c10::InferenceMode guard;
  const OracleCase c = load_case(GetParam());
  const Fp8Errors e = fp8_forward_errors(c, at::kBFloat16, at::kCUDA);
  std::cout << GetParam() << ": --fp8-gemms on CUDA, rms relative error to the FP8 reference " << e.to_fp8
            << ", to bf16 " << e.to_unquantised << "\n";
  // bf16 only on CUDA; _scaled_mm and flash attention round in other places than the CPU.
  expect_fp8_errors(e, c.expected_fp8, c.expected_bf16, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(Oracle, FluxOracleCuda, ::testing::ValuesIn(kCases));

// --fp8-gemms converts the blocks as they load, a part of the held range at a time (io::LoadPolicy::
// converting_part_bytes), so that the device never holds the whole range twice. Parts of one block each must give
// the bits of one part for the whole range, in one load per part.
TEST(FluxTransformer, Fp8BlocksConvertAPartAtATimeWithTheSameBits) {
  c10::InferenceMode guard;
  const OracleCase c = load_case("dev_like");
  const CaseWeights loaded = case_weights(c);  // named, not bound: C++17 lambdas cannot capture bindings
  const FluxConfig& config = loaded.config;
  const auto& weights = loaded.weights;
  const auto load_with_parts_of = [&](uint64_t part_bytes, FluxParts parts, size_t& loads) {
    io::LoadPolicy policy;
    policy.converting_part_bytes = part_bytes;
    io::set_load_policy(policy);
    const size_t before = io::load_history().size();
    flux::set_fp8_gemms_enabled(true);
    auto model = FluxTransformer::load(weights, config, at::kBFloat16, at::kCPU, parts);
    flux::set_fp8_gemms_enabled(false);
    io::set_load_policy({});
    loads = io::load_history().size() - before;
    return model;
  };
  size_t whole_loads = 0, block_loads = 0, stage_loads = 0;
  const auto whole = load_with_parts_of(uint64_t{1} << 40, FluxParts::all(), whole_loads);
  const auto by_block = load_with_parts_of(1, FluxParts::all(), block_loads);
  EXPECT_EQ(whole_loads, 2U) << "the embedders and the head, then all blocks as one part";
  EXPECT_EQ(block_loads, static_cast<size_t>(1 + config.num_blocks())) << "the embedders and the head, then each block";
  const FluxInputs inputs = cast_inputs(c.inputs, at::kBFloat16);
  EXPECT_TRUE(at::equal(whole.forward(inputs), by_block.forward(inputs)));
  load_with_parts_of(1, FluxParts::blocks(1, 3), stage_loads);
  EXPECT_EQ(stage_loads, 2U) << "a stage holding blocks 1 and 2, one part each";
}

// Planning sizes blocks as --fp8-gemms holds them (placement::BlockWeights::fp8_gemms, from the names and shapes
// alone): each must be exactly what a loaded block holds once converted, and at the run dtype what it holds
// unconverted. Both tiny configs with FP8-sized projections, one with a guidance embedding and one without.
TEST(FluxTransformer, PlannedFp8BlockSizesAreWhatTheConvertedBlocksHold) {
  c10::InferenceMode guard;
  for (const std::string name : {"dev_like", "guidance_nonsquare"}) {
    const std::string dir = dp::test::reference_dir() + "/flux/" + name + "/transformer";
    const auto config = FluxConfig::from_json(read_json_file(dir + "/config.json"), dir);
    const auto index = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
    const auto fp8_tree = placement::flux_module_tree(config, *index, io::DType::BF16,
                                                      placement::BlockWeights::fp8_gemms);
    const auto bf16_tree = placement::flux_module_tree(config, *index, io::DType::BF16);
    const ModuleWeights root(index, at::kBFloat16, at::kCPU);
    const auto dbl = flux::DoubleBlock::load(root.child("transformer_blocks.0"), config);
    const auto sgl = flux::SingleBlock::load(root.child("single_transformer_blocks.0"), config);
    EXPECT_EQ(static_cast<int64_t>(dbl.nbytes()), bf16_tree.size_of("transformer_blocks.0")) << name;
    EXPECT_EQ(static_cast<int64_t>(sgl.nbytes()), bf16_tree.size_of("single_transformer_blocks.0")) << name;
    EXPECT_EQ(static_cast<int64_t>(flux::to_fp8(dbl).nbytes()), fp8_tree.size_of("transformer_blocks.0")) << name;
    EXPECT_EQ(static_cast<int64_t>(flux::to_fp8(sgl).nbytes()), fp8_tree.size_of("single_transformer_blocks.0"))
        << name;
    EXPECT_LT(fp8_tree.size_of("transformer_blocks.0"), bf16_tree.size_of("transformer_blocks.0")) << name
        << ": no projection converted; the case no longer tests FP8 sizes";
    EXPECT_EQ(fp8_tree.size_of("x_embedder"), bf16_tree.size_of("x_embedder")) << "only the blocks convert";
  }
}

// The warm-up beside the load (runtime/load_phase.cpp) runs blocks built of zeros from the headers alone: the
// checkpoint's shapes, nothing read, every output zero; in FP8 too, where a zero weight's scale must stay finite.
TEST(FluxTransformer, ZeroWeightsTakeTheCheckpointsShapesAndReadNothing) {
  c10::InferenceMode guard;
  const OracleCase c = load_case("dev_like");
  const CaseWeights model = case_weights(c);
  const at::Tensor real = FluxTransformer::load(model.weights, model.config, at::kFloat, at::kCPU).forward(c.inputs);
  ASSERT_GT(real.abs().max().item<float>(), 0.0F);
  for (const bool fp8 : {false, true}) {
    flux::set_fp8_gemms_enabled(fp8);
    const size_t loads_before = io::load_history().size();
    const at::ScalarType dtype = fp8 ? at::kBFloat16 : at::kFloat;
    const auto zeros = FluxTransformer::load(model.weights, model.config, dtype, at::kCPU, FluxParts::all(), nullptr,
                                             WeightSource::zeros);
    flux::set_fp8_gemms_enabled(false);
    EXPECT_EQ(io::load_history().size(), loads_before) << "fp8 " << fp8 << ": a load read the files";
    const at::Tensor out = zeros.forward(cast_inputs(c.inputs, dtype));
    EXPECT_EQ(out.sizes(), real.sizes()) << "fp8 " << fp8;
    EXPECT_TRUE(at::equal(out, at::zeros_like(out))) << "fp8 " << fp8 << ": zero weights gave a nonzero output";
  }
  FluxParts offloading = FluxParts::all();
  offloading.offloaded[1] = OffloadedWeights::pinned_host;
  EXPECT_THROW(FluxTransformer::load(model.weights, model.config, at::kFloat, at::kCPU, offloading, nullptr,
                                     WeightSource::zeros),
               dp::Error);
}

TEST(FluxTransformer, StageLoadsOnlyItsOwnTensors) {
  c10::InferenceMode guard;
  // A checkpoint holding only transformer_blocks.1: a stage owning block 1 must load from it, proving it
  // neither reads nor allocates anything else.
  const std::string source = dp::test::reference_dir() + "/flux/dev_like/transformer";
  const auto full = io::WeightIndex::open_dir(source);
  const auto dir = dp::test::temp_dir("flux-partial");
  std::filesystem::copy_file(source + "/config.json", dir + "/config.json");
  io::SafetensorsWriter writer;
  std::vector<std::string> names;
  for (const auto& name : full.names()) {
    if (name.rfind("transformer_blocks.1.", 0) != 0) continue;
    writer.add(name, full.info(name).dtype, full.info(name).shape);
    names.push_back(name);
  }
  writer.write(dir + "/diffusion_pytorch_model.safetensors", [&](std::size_t i, void* out, uint64_t n) {
    std::memcpy(out, full.mapped_file(names[i])->data(full.info(names[i])), n);
  });
  const auto stage = FluxTransformer::load(dir, at::kFloat, at::kCPU, FluxParts::blocks(1, 2));
  EXPECT_THROW(FluxTransformer::load(dir, at::kFloat, at::kCPU, FluxParts::blocks(1, 3)), dp::Error);
  EXPECT_THROW(stage.embed_text(at::zeros({1, 2, 48})), dp::Error);
  FluxActivations state{at::zeros({1, 4, 64}), at::zeros({1, 2, 64}), at::zeros({1, 64})};
  const auto rope = stage.rotary(at::zeros({2, 3}), at::zeros({4, 3}));
  EXPECT_THROW(stage.run_blocks(state, rope, 0, 2), dp::Error);
  stage.run_blocks(state, rope, 1, 2);
  EXPECT_EQ(state.image.sizes(), (std::vector<int64_t>{1, 4, 64}));
}

// Offloaded blocks travel between host and device through Block::map (models/flux/flux_offload.h): a weight
// that map forgot would be undefined on the GPU. Here every weight must go through it, and the copy must
// compute exactly what the original does.
TEST(FluxTransformer, OffloadedBlocksCopyEveryWeightAndComputeTheSame) {
  c10::InferenceMode guard;
  const std::string dir = dp::test::reference_dir() + "/flux/dev_like/transformer";
  const auto config = FluxConfig::from_json(read_json_file(dir + "/config.json"), dir);
  const ModuleWeights root(std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir)), at::kFloat, at::kCPU);
  const auto dbl = flux::DoubleBlock::load(root.child("transformer_blocks.0"), config);
  const auto sgl = flux::SingleBlock::load(root.child("single_transformer_blocks.0"), config);
  uint64_t mapped_bytes = 0;
  const flux::TensorMap copy = [&](const at::Tensor& t) {
    mapped_bytes += t.nbytes();
    return t.clone();
  };
  const auto dbl_copy = dbl.map(copy);
  EXPECT_EQ(mapped_bytes, dbl.nbytes());
  uint64_t checkpoint_bytes = 0;
  const auto index = io::WeightIndex::open_dir(dir);
  for (const auto& name : index.names())
    if (name.rfind("transformer_blocks.0.", 0) == 0) checkpoint_bytes += index.info(name).nbytes();
  EXPECT_EQ(dbl.nbytes(), checkpoint_bytes) << "a double block's weights are its checkpoint tensors, concatenated";
  mapped_bytes = 0;
  const auto sgl_copy = sgl.map(copy);
  EXPECT_EQ(mapped_bytes, sgl.nbytes());

  const int64_t dim = config.inner_dim();
  at::manual_seed(3);
  const at::Tensor image = at::randn({1, 4, dim}), text = at::randn({1, 2, dim}), temb = at::randn({1, dim});
  const auto model = FluxTransformer::load(dir, at::kFloat, at::kCPU);
  const auto rope = model.rotary(at::zeros({2, 3}), at::zeros({4, 3}));
  const auto run = [&](const auto& block) {
    at::Tensor i = image.clone(), t = text.clone();
    block.forward(i, t, temb, rope);
    return std::make_pair(i, t);
  };
  EXPECT_TRUE(at::equal(run(dbl).first, run(dbl_copy).first));
  EXPECT_TRUE(at::equal(run(dbl).second, run(dbl_copy).second));
  EXPECT_TRUE(at::equal(run(sgl).first, run(sgl_copy).first));

  FluxParts parts = FluxParts::all();
  parts.offloaded = {{config.num_blocks(), OffloadedWeights::pinned_host}};
  EXPECT_THROW(FluxTransformer::load(dir, at::kFloat, at::kCPU, parts), dp::Error) << "a block outside the range";
}

// The streaming path (flux_offload.h: two slots, the next block prefetched, the prefetch wrapping round to
// the first block for the next step, a copy per use) against every block resident, on `device`: on the CPU
// it streams to the host exactly as it streams to a GPU, so a mistake in it shows in every CPU run.
// Offloaded: both kinds, two of them adjacent, the first and the last block among them; two whole steps,
// then a partial range that starts inside the offloaded set.
void expect_streaming_equals_resident(const at::Device& device) {
  c10::InferenceMode guard;
  const std::string dir = dp::test::reference_dir() + "/flux/dev_like/transformer";
  const auto config = FluxConfig::from_json(read_json_file(dir + "/config.json"), dir);
  ASSERT_GE(config.num_layers, 2);
  ASSERT_GE(config.num_blocks() - config.num_layers, 3);
  const int64_t last = config.num_blocks() - 1;
  FluxParts parts = FluxParts::all();
  parts.offloaded = {{0, OffloadedWeights::mapped_file}, {1, OffloadedWeights::pinned_host},
                     {config.num_layers + 1, OffloadedWeights::mapped_file}, {last, OffloadedWeights::pinned_host}};
  const auto resident = FluxTransformer::load(dir, at::kFloat, device);
  const auto streamed = FluxTransformer::load(dir, at::kFloat, device, parts);
  EXPECT_EQ(resident.offload_stats().copies, 0);

  const int64_t dim = config.inner_dim();
  at::manual_seed(5);
  const at::Tensor image = at::randn({2, 6, dim}).to(device), text = at::randn({2, 3, dim}).to(device);
  const at::Tensor temb = at::randn({2, dim}).to(device);
  const auto rope = resident.rotary(at::zeros({3, 3}), at::randn({6, 3}));
  FluxActivations a{image.clone(), text.clone(), temb}, b{image.clone(), text.clone(), temb};
  const int steps = 2;
  for (int step = 0; step < steps; ++step) {
    resident.run_blocks(a, rope, 0, config.num_blocks());
    streamed.run_blocks(b, rope, 0, config.num_blocks());
    EXPECT_TRUE(at::equal(a.image, b.image)) << "step " << step << ": max difference "
                                             << (a.image - b.image).abs().max().item<double>();
    EXPECT_TRUE(at::equal(a.text, b.text)) << "step " << step;
  }
  // The first use fills a slot, and every use copies the next offloaded block in (the last one's next is the
  // first, for the following step): 4 blocks a step, plus that first fill.
  const auto stats = streamed.offload_stats();
  EXPECT_EQ(stats.blocks, 4);
  EXPECT_EQ(stats.copies, 4 * steps + 1);
  EXPECT_GT(stats.bytes, 0u);
  // A partial range that begins past the prefetched block: the block is filled on demand.
  FluxActivations c{image.clone(), text.clone(), temb}, d{image.clone(), text.clone(), temb};
  resident.run_blocks(c, rope, config.num_layers, config.num_blocks());
  streamed.run_blocks(d, rope, config.num_layers, config.num_blocks());
  EXPECT_TRUE(at::equal(c.image, d.image)) << "partial range";
}

TEST(FluxTransformer, OffloadedBlocksStreamOnTheCpuAndComputeTheSameAsResident) {
  expect_streaming_equals_resident(at::kCPU);
}

// Streamed host copies keep their source's offset within a 64-byte line: MKL's one-row product sums in
// another order by the weight's alignment (seen on an AMD EPYC: a 192x32 weight 4 bytes into a line against
// one on a line, 1-4 ulps apart), and resident weights are views of the file at any 4-byte offset.
TEST(FluxTransformer, HostCopiesKeepTheSourcesAlignment) {
  const at::Tensor backing = at::randn({8192});
  for (int64_t shift : {0, 1, 3, 7, 15, 16}) {
    const at::Tensor source = backing.narrow(0, shift, 192 * 32).view({192, 32});
    const at::Tensor copy = host_copy_keeping_alignment(source);
    EXPECT_NE(copy.data_ptr(), source.data_ptr()) << "a copy, not the source";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copy.data_ptr()) % 64, reinterpret_cast<uintptr_t>(source.data_ptr()) % 64)
        << "shift " << shift;
    EXPECT_TRUE(at::equal(copy, source));
    EXPECT_TRUE(copy.is_contiguous());
    const at::Tensor x = at::randn({1, 32});
    EXPECT_TRUE(at::equal(at::linear(x, copy), at::linear(x, source))) << "one-row product, shift " << shift;
  }
  EXPECT_TRUE(at::equal(host_copy_keeping_alignment(at::arange(6).view({2, 3}).t()), at::arange(6).view({2, 3}).t()))
      << "a strided source is copied contiguous";
}

TEST(FluxTransformerCuda, OffloadedBlocksStreamToTheGpuAndComputeTheSameAsResident) {
  DP_TEST_NEED_CUDA();
  expect_streaming_equals_resident(at::Device(at::kCUDA, 0));
}

TEST(FluxTransformer, ConfigAndShapeErrorsNameTheCulprit) {
  const std::string source = dp::test::reference_dir() + "/flux/dev_like/transformer";
  auto config_json = read_json_file(source + "/config.json");
  auto expect_error = [](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << part;
    } catch (const dp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  auto bad = config_json;
  bad["axes_dims_rope"] = {4, 14, 12};
  expect_error([&] { FluxConfig::from_json(bad, "cfg.json"); }, "axes_dims_rope sums to 30");
  bad = config_json;
  bad["num_attention_heads"] = "two";
  expect_error([&] { FluxConfig::from_json(bad, "cfg.json"); }, "'num_attention_heads'");
  // A config that disagrees with the weights: the error names the tensor and both shapes.
  auto weights = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(source));
  auto wrong = FluxConfig::from_json(config_json, "cfg.json");
  wrong.joint_attention_dim = 50;
  expect_error([&] { FluxTransformer::load(weights, wrong, at::kFloat, at::kCPU); }, "context_embedder.weight");
  expect_error([&] { FluxTransformer::load(weights, FluxConfig::from_json(config_json, "c"), at::kFloat, at::kCPU,
                                           FluxParts{false, 3, 99, false}); },
               "outside the model's 7 blocks");
}

TEST(FluxTransformer, ParameterListMatchesCheckpoint) {
  // flux_parameter_shapes drives planning and make-random; it must name exactly the checkpoint's tensors.
  for (const auto& name : kCases) {
    const std::string dir = dp::test::reference_dir() + "/flux/" + name + "/transformer";
    const auto weights = io::WeightIndex::open_dir(dir);
    const auto config = FluxConfig::from_json(read_json_file(dir + "/config.json"), dir);
    const auto shapes = flux_parameter_shapes(config);
    EXPECT_EQ(shapes.size(), weights.size()) << name;
    for (const auto& p : shapes) {
      ASSERT_TRUE(weights.contains(p.name)) << name << ": " << p.name;
      EXPECT_EQ(weights.info(p.name).shape, p.shape) << p.name;
    }
  }
}

}  // namespace
}  // namespace dp::models
