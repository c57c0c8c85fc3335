#include "placement/flux_module_tree.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/error.h"

namespace dp::placement {
namespace {

// Registers modules in diffusers' order. Parameter sizes are filled in afterwards, so the structure is
// written once for both sizing sources.
class FluxTreeBuilder {
 public:
  explicit FluxTreeBuilder(const models::FluxConfig& config) : c_(config), tree_("FluxTransformer2DModel") {
    tree_.no_split_classes = {"FluxTransformerBlock", "FluxSingleTransformerBlock"};
  }

  ModuleTree build() {
    const int root = tree_.root();
    tree_.add_module(root, "pos_embed", "FluxPosEmbed");
    add_time_text_embed(root);
    linear(root, "context_embedder");
    linear(root, "x_embedder");
    const int doubles = tree_.add_module(root, "transformer_blocks", "ModuleList");
    for (int64_t i = 0; i < c_.num_layers; ++i) add_double_block(doubles, std::to_string(i));
    const int singles = tree_.add_module(root, "single_transformer_blocks", "ModuleList");
    for (int64_t i = 0; i < c_.num_single_layers; ++i) add_single_block(singles, std::to_string(i));
    const int norm_out = tree_.add_module(root, "norm_out", "AdaLayerNormContinuous");
    tree_.add_module(norm_out, "silu", "SiLU");
    linear(norm_out, "linear");
    tree_.add_module(norm_out, "norm", "LayerNorm");  // elementwise_affine=False: no parameters
    linear(root, "proj_out");
    return std::move(tree_);
  }

 private:
  void linear(int parent, const std::string& name) {
    const int m = tree_.add_module(parent, name, "Linear");
    tree_.add_tensor(m, "weight", 0);
    tree_.add_tensor(m, "bias", 0);
  }
  void rms_norm(int parent, const std::string& name) {
    const int m = tree_.add_module(parent, name, "RMSNorm");
    tree_.add_tensor(m, "weight", 0);
  }
  void timestep_embedding(int parent, const std::string& name) {
    const int m = tree_.add_module(parent, name, "TimestepEmbedding");
    linear(m, "linear_1");
    tree_.add_module(m, "act", "SiLU");
    linear(m, "linear_2");
  }
  void add_time_text_embed(int root) {
    const int m = tree_.add_module(root, "time_text_embed",
                                   c_.guidance_embeds ? "CombinedTimestepGuidanceTextProjEmbeddings"
                                                      : "CombinedTimestepTextProjEmbeddings");
    tree_.add_module(m, "time_proj", "Timesteps");
    timestep_embedding(m, "timestep_embedder");
    if (c_.guidance_embeds) timestep_embedding(m, "guidance_embedder");
    const int text = tree_.add_module(m, "text_embedder", "PixArtAlphaTextProjection");
    linear(text, "linear_1");
    tree_.add_module(text, "act_1", "SiLU");
    linear(text, "linear_2");
  }
  void ada_norm(int parent, const std::string& name, const char* class_name) {
    const int m = tree_.add_module(parent, name, class_name);
    tree_.add_module(m, "silu", "SiLU");
    linear(m, "linear");
    tree_.add_module(m, "norm", "LayerNorm");
  }
  void attention(int parent, bool joint) {
    const int m = tree_.add_module(parent, "attn", "FluxAttention");
    rms_norm(m, "norm_q");
    rms_norm(m, "norm_k");
    linear(m, "to_q");
    linear(m, "to_k");
    linear(m, "to_v");
    if (!joint) return;  // single blocks use pre_only attention: no output or text projections
    const int to_out = tree_.add_module(m, "to_out", "ModuleList");
    linear(to_out, "0");
    tree_.add_module(to_out, "1", "Dropout");
    rms_norm(m, "norm_added_q");
    rms_norm(m, "norm_added_k");
    linear(m, "add_q_proj");
    linear(m, "add_k_proj");
    linear(m, "add_v_proj");
    linear(m, "to_add_out");
  }
  void feed_forward(int parent, const std::string& name) {
    const int ff = tree_.add_module(parent, name, "FeedForward");
    const int net = tree_.add_module(ff, "net", "ModuleList");
    const int gelu = tree_.add_module(net, "0", "GELU");
    linear(gelu, "proj");
    tree_.add_module(net, "1", "Dropout");
    linear(net, "2");
  }
  void add_double_block(int list, const std::string& index) {
    const int b = tree_.add_module(list, index, "FluxTransformerBlock");
    ada_norm(b, "norm1", "AdaLayerNormZero");
    ada_norm(b, "norm1_context", "AdaLayerNormZero");
    attention(b, true);
    tree_.add_module(b, "norm2", "LayerNorm");
    feed_forward(b, "ff");
    tree_.add_module(b, "norm2_context", "LayerNorm");
    feed_forward(b, "ff_context");
  }
  void add_single_block(int list, const std::string& index) {
    const int b = tree_.add_module(list, index, "FluxSingleTransformerBlock");
    ada_norm(b, "norm", "AdaLayerNormZeroSingle");
    linear(b, "proj_mlp");
    tree_.add_module(b, "act_mlp", "GELU");
    linear(b, "proj_out");
    attention(b, false);
  }

  const models::FluxConfig& c_;
  ModuleTree tree_;
};

bool is_floating(io::DType dtype) {
  return dtype == io::DType::F64 || dtype == io::DType::F32 || dtype == io::DType::F16 || dtype == io::DType::BF16;
}

uint64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), uint64_t{1}, [](uint64_t a, int64_t d) { return a * d; });
}

// The builder's tensors and flux_parameter_shapes must agree; both encode diffusers' registration order.
std::map<std::string, std::vector<int64_t>> checked_shapes(const models::FluxConfig& config, const ModuleTree& tree) {
  const auto shapes = models::flux_parameter_shapes(config);
  const auto order = tree.tensors_in_order();
  DP_CHECK_EQ(order.size(), shapes.size(), "FLUX module tree and flux_parameter_shapes disagree on the tensor count");
  std::map<std::string, std::vector<int64_t>> by_name;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    DP_CHECK(order[i] == shapes[i].name, "FLUX module tree and flux_parameter_shapes disagree at position ", i,
             ": '", order[i], "' vs '", shapes[i].name, "'");
    by_name[shapes[i].name] = shapes[i].shape;
  }
  return by_name;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// What a tensor occupies on its device once loaded, and converted where --fp8-gemms converts it.
int64_t held_bytes(const std::string& name, const std::vector<int64_t>& shape, io::DType stored, uint64_t numel,
                   io::DType run_dtype, BlockWeights blocks) {
  if (blocks == BlockWeights::fp8_gemms && is_floating(stored) && models::flux_fp8_gemm_weight(name, shape))
    return models::flux_fp8_gemm_weight_bytes(shape);
  return bytes_at_run_dtype(stored, numel, run_dtype);
}

}  // namespace

int64_t bytes_at_run_dtype(io::DType stored, uint64_t numel, io::DType run_dtype) {
  const std::size_t size = is_floating(stored) ? io::dtype_size(run_dtype) : io::dtype_size(stored);
  return static_cast<int64_t>(numel * size);
}

ModuleTree flux_module_tree(const models::FluxConfig& config, io::DType run_dtype, BlockWeights blocks) {
  ModuleTree tree = FluxTreeBuilder(config).build();
  for (const auto& [name, shape] : checked_shapes(config, tree))
    tree.set_tensor_bytes(name, held_bytes(name, shape, run_dtype, numel_of(shape), run_dtype, blocks));
  return tree;
}

ModuleTree flux_module_tree(const models::FluxConfig& config, const io::WeightIndex& weights, io::DType run_dtype,
                            BlockWeights blocks) {
  ModuleTree tree = FluxTreeBuilder(config).build();
  const auto shapes = checked_shapes(config, tree);
  for (const auto& name : weights.names()) {
    auto it = shapes.find(name);
    DP_CHECK(it != shapes.end(), weights.dir(), ": checkpoint tensor '", name,
             "' is not a parameter of FluxTransformer2DModel with this config.json");
    const auto& info = weights.info(name);
    DP_CHECK(info.shape == it->second, weights.dir(), ": tensor '", name, "' has shape ", shape_text(info.shape),
             " but config.json implies ", shape_text(it->second));
    tree.set_tensor_bytes(name, held_bytes(name, info.shape, info.dtype, info.numel(), run_dtype, blocks));
  }
  for (const auto& [name, shape] : shapes)
    DP_CHECK(weights.contains(name), weights.dir(), ": checkpoint has no tensor '", name,
             "' that config.json implies (", shape_text(shape), ")");
  return tree;
}

int64_t flux_largest_block_bytes(const models::FluxConfig& config, const ModuleTree& tree) {
  int64_t largest = 0;
  for (int64_t b = 0; b < config.num_layers; ++b)
    largest = std::max(largest, tree.size_of("transformer_blocks." + std::to_string(b)));
  for (int64_t b = 0; b < config.num_single_layers; ++b)
    largest = std::max(largest, tree.size_of("single_transformer_blocks." + std::to_string(b)));
  return largest;
}

}  // namespace dp::placement
