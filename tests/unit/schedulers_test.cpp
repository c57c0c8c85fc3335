// FlowMatchEulerScheduler against diffusers (tests/reference/cases_scheduler.py): schedules must be
// bit-equal in float32, FluxPipeline's mu and default sigmas equal in float64, Euler steps bit-equal.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/json_file.h"
#include "schedulers/flow_match_scheduler.h"
#include "test_support.h"

namespace dp::schedulers {
namespace {

std::string scheduler_reference() { return dp::test::reference_dir() + "/scheduler"; }

std::vector<uint32_t> float_bits(const std::vector<float>& values) {
  std::vector<uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

at::Tensor tensor_from_bits(const nlohmann::json& bits, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  const auto raw = bits.get<std::vector<uint32_t>>();
  at::Tensor values = at::empty({static_cast<int64_t>(raw.size())}, at::kFloat);
  std::memcpy(values.data_ptr<float>(), raw.data(), raw.size() * sizeof(uint32_t));
  return values.reshape(shape).to(dtype);  // bf16 values were written from bf16, so the cast is exact
}

std::vector<uint32_t> tensor_bits(const at::Tensor& tensor) {
  const at::Tensor values = tensor.to(at::kFloat).contiguous().flatten();
  std::vector<uint32_t> out(static_cast<size_t>(values.numel()));
  std::memcpy(out.data(), values.data_ptr<float>(), out.size() * sizeof(uint32_t));
  return out;
}

nlohmann::json load_cases() {
  const std::string path = scheduler_reference() + "/cases.json";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "oracle output missing: " << path;
    return nlohmann::json::object({{"schedules", nlohmann::json::array()}, {"euler", nlohmann::json::array()}});
  }
  return read_json_file(path);
}

FlowMatchEulerScheduler scheduler_for(const std::string& config_name) {
  return FlowMatchEulerScheduler(
      FlowMatchSchedulerConfig::from_file(scheduler_reference() + "/" + config_name + "/scheduler_config.json"));
}

TEST(FlowMatchScheduler, SchedulesMatchDiffusersBitForBit) {
  const auto cases = load_cases();
  ASSERT_GT(cases["schedules"].size(), 100u);
  for (const auto& c : cases["schedules"]) {
    const std::string name = c["config"].get<std::string>();
    const std::string mode = c["mode"].get<std::string>();
    SCOPED_TRACE(name + " " + mode + " " + c.dump().substr(0, 120));
    auto scheduler = scheduler_for(name);
    const bool has_mu = !c["mu"].is_null();
    const double mu = has_mu ? c["mu"].get<double>() : 0.0;
    if (mode == "pipeline") {
      const int steps = c["steps"].get<int>();
      const double expected_mu = flux_calculate_shift(c["image_seq_len"].get<int64_t>(), scheduler.config());
      EXPECT_EQ(expected_mu, mu);
      const auto sigmas = flux_default_sigmas(steps);
      EXPECT_EQ(sigmas, c["default_sigmas"].get<std::vector<double>>());
      scheduler.set_timesteps_from_sigmas(sigmas, scheduler.config().use_dynamic_shifting ? &mu : nullptr);
    } else if (mode == "num_steps") {
      scheduler.set_timesteps(c["steps"].get<int>(), has_mu ? &mu : nullptr);
    } else {
      scheduler.set_timesteps_from_sigmas(c["custom_sigmas"].get<std::vector<double>>(), has_mu ? &mu : nullptr);
    }
    EXPECT_EQ(float_bits(scheduler.timesteps()), c["timesteps"].get<std::vector<uint32_t>>());
    EXPECT_EQ(float_bits(scheduler.sigmas()), c["sigmas"].get<std::vector<uint32_t>>());
  }
}

TEST(FlowMatchScheduler, EulerStepsMatchDiffusersBitForBit) {
  const auto cases = load_cases();
  ASSERT_EQ(cases["euler"].size(), 4u);
  for (const auto& c : cases["euler"]) {
    SCOPED_TRACE(c["config"].get<std::string>() + " " + c["dtype"].get<std::string>());
    const auto dtype = c["dtype"].get<std::string>() == "bfloat16" ? at::kBFloat16 : at::kFloat;
    const auto shape = c["shape"].get<std::vector<int64_t>>();
    auto scheduler = scheduler_for(c["config"].get<std::string>());
    const double mu = c["mu"].is_null() ? 0.0 : c["mu"].get<double>();
    scheduler.set_timesteps_from_sigmas(flux_default_sigmas(c["steps"].get<int>()),
                                        c["mu"].is_null() ? nullptr : &mu);
    at::Tensor sample = tensor_from_bits(c["initial"], shape, dtype);
    for (int i = 0; i < scheduler.num_inference_steps(); ++i) {
      const at::Tensor model_output = tensor_from_bits(c["model_outputs"][i], shape, dtype);
      sample = scheduler.step(model_output, i, sample);
      ASSERT_EQ(sample.scalar_type(), dtype);
      EXPECT_EQ(tensor_bits(sample), c["samples"][i].get<std::vector<uint32_t>>()) << "step " << i;
    }
  }
}

TEST(FlowMatchScheduler, RejectsBadConfigsAndCalls) {
  const std::string dir = dp::test::temp_dir("scheduler");
  dp::test::write_file(dir + "/karras.json", R"({"use_karras_sigmas": true})");
  try {
    FlowMatchSchedulerConfig::from_file(dir + "/karras.json");
    ADD_FAILURE() << "karras sigmas accepted";
  } catch (const dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_karras_sigmas"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("karras.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(FlowMatchSchedulerConfig::from_file(dir + "/missing.json"), dp::Error);
  FlowMatchSchedulerConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  FlowMatchEulerScheduler scheduler(dynamic);
  EXPECT_THROW(scheduler.set_timesteps(4), dp::Error);  // mu missing
  const double mu = 0.5;
  scheduler.set_timesteps(4, &mu);
  EXPECT_THROW(scheduler.step(at::zeros({2}), 4, at::zeros({2})), dp::Error);
}

}  // namespace
}  // namespace dp::schedulers
