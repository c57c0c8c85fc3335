#include "models/clip/clip_text_model.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/json_file.h"
#include "models/attention.h"
#include "models/warm_up_allowance.h"
#include "io/weight_index.h"

namespace dp::models {

ClipTextModel::LayerNorm ClipTextModel::LayerNorm::load(const ModuleWeights& w, const std::string& name,
                                                        int64_t dim, double eps) {
  const ModuleWeights scope = w.child(name);
  return {scope.get_shaped("weight", {dim}), scope.get_shaped("bias", {dim}), eps};
}

at::Tensor ClipTextModel::LayerNorm::operator()(const at::Tensor& x) const {
  return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
}

ClipTextModel ClipTextModel::load(const std::string& dir, at::ScalarType dtype, at::Device device,
                                  std::shared_ptr<const LoraSet> lora) {
  DP_CHECK(std::filesystem::is_directory(dir), dir, ": CLIP text encoder folder not found");
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  ClipTextModel model;
  model.config_ = ClipTextConfig::from_json(read_json_file(config_path), config_path);
  model.dtype_ = dtype;
  model.device_ = device;
  const ClipTextConfig& c = model.config_;
  model.activation_ = text_encoder_activation(c.hidden_act, config_path);

  auto index = std::make_shared<const io::WeightIndex>(io::WeightIndex::open_dir(dir));
  // transformers 5 dropped the CLIPTextTransformer wrapper and renames "text_model.*" on load.
  const bool prefixed = index->contains("text_model.embeddings.token_embedding.weight");
  model.lora_ = LoraBinding::make(std::move(lora), io::LoraComponent::text_encoder);
  if (model.lora_) model.lora_->set->check_finite(io::LoraComponent::text_encoder, [](const io::LoraModule&) { return true; });
  const ModuleWeights root =
      ModuleWeights(index, dtype, device, prefixed ? "text_model" : "").with_lora(model.lora_).read_ahead();

  const int64_t d = c.hidden_size;
  model.token_embedding_ = root.get_shaped("embeddings.token_embedding.weight", {c.vocab_size, d});
  model.position_embedding_ = root.get_shaped("embeddings.position_embedding.weight", {c.max_position_embeddings, d});
  const ModuleWeights layers = root.child("encoder.layers");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const ModuleWeights w = layers.child(std::to_string(i));
    const ModuleWeights attn = w.child("self_attn");
    const ModuleWeights mlp = w.child("mlp");
    EncoderLayer layer;
    layer.layer_norm1 = LayerNorm::load(w, "layer_norm1", d, c.layer_norm_eps);
    layer.q_proj = Linear::load(attn, "q_proj", d, d);
    layer.k_proj = Linear::load(attn, "k_proj", d, d);
    layer.v_proj = Linear::load(attn, "v_proj", d, d);
    layer.out_proj = Linear::load(attn, "out_proj", d, d);
    layer.layer_norm2 = LayerNorm::load(w, "layer_norm2", d, c.layer_norm_eps);
    layer.fc1 = Linear::load(mlp, "fc1", d, c.intermediate_size);
    layer.fc2 = Linear::load(mlp, "fc2", c.intermediate_size, d);
    model.layers_.push_back(std::move(layer));
  }
  model.final_layer_norm_ = LayerNorm::load(root, "final_layer_norm", d, c.layer_norm_eps);
  return model;
}

int64_t ClipTextModel::warm_up_bytes(const ClipTextConfig& c, at::ScalarType dtype, int64_t batch) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t d = c.hidden_size, inner = c.intermediate_size, seq = c.max_position_embeddings;
  // One layer (four projections, two MLP matrices, biases, norms), the position table, the final norm.
  const int64_t weights = (4 * d * d + 2 * d * inner + 12 * d + inner + seq * d) * element;
  const int64_t activations = batch * seq * (8 * d + 2 * inner) * 4 + batch * c.num_attention_heads * seq * seq * 8;
  return weights + activations + kWarmUpLibraryWorkspaceBytes + kWarmUpSmallTensorsBytes;
}

double ClipTextModel::warm_up(const ClipTextConfig& c, at::ScalarType dtype, at::Device device, int64_t batch) {
  c10::InferenceMode inference;
  const auto started = std::chrono::steady_clock::now();
  ClipTextModel model;
  model.config_ = c;
  model.dtype_ = dtype;
  model.device_ = device;
  model.activation_ = text_encoder_activation(c.hidden_act, "CLIP warm-up");
  const auto zeros = [&](std::vector<int64_t> shape) { return at::zeros(shape, at::TensorOptions().dtype(dtype).device(device)); };
  const int64_t d = c.hidden_size, inner = c.intermediate_size;
  // Token 0 only: the embedding lookup runs, without a vocabulary-sized table.
  model.token_embedding_ = zeros({1, d});
  model.position_embedding_ = zeros({c.max_position_embeddings, d});
  const auto norm = [&] { return LayerNorm{zeros({d}), zeros({d}), c.layer_norm_eps}; };
  const auto linear = [&](int64_t in, int64_t out) { return Linear{zeros({out, in}), zeros({out}), nullptr, at::Tensor()}; };
  EncoderLayer layer;
  layer.layer_norm1 = norm();
  layer.q_proj = linear(d, d);
  layer.k_proj = linear(d, d);
  layer.v_proj = linear(d, d);
  layer.out_proj = linear(d, d);
  layer.layer_norm2 = norm();
  layer.fc1 = linear(d, inner);
  layer.fc2 = linear(inner, d);
  model.layers_.push_back(std::move(layer));
  model.final_layer_norm_ = norm();
  const at::Tensor ids = at::zeros({batch, c.max_position_embeddings}, at::TensorOptions().dtype(at::kLong));
  (void)model.forward(ids).pooled_output.sum().item<float>();  // waits for the device
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

void ClipTextModel::select_adapters(const std::vector<int64_t>& choice_per_row) const {
  if (lora_) lora_->select_rows(choice_per_row);
}

at::Tensor ClipTextModel::encoder_layer(const EncoderLayer& layer, const at::Tensor& hidden) const {
  const int64_t batch = hidden.size(0), seq = hidden.size(1);
  const int64_t heads = config_.num_attention_heads, head_dim = config_.head_dim();
  const at::Tensor normed = layer.layer_norm1(hidden);
  auto split_heads = [&](const at::Tensor& x) { return x.view({batch, seq, heads, head_dim}).transpose(1, 2); };
  const at::Tensor q = split_heads(layer.q_proj(normed));
  const at::Tensor k = split_heads(layer.k_proj(normed));
  const at::Tensor v = split_heads(layer.v_proj(normed));
  // transformers 5 runs CLIP through SDPA by default; without a padding mask it passes is_causal=True and
  // scale head_dim**-0.5: the same arithmetic (on the CPU the same kernel; on CUDA see models/attention.h).
  const at::Tensor attended =
      encoder_attention(q, k, v, std::nullopt, /*causal=*/true, std::pow(double(head_dim), -0.5))
          .transpose(1, 2)
          .contiguous()
          .reshape({batch, seq, heads * head_dim});
  const at::Tensor after_attention = hidden + layer.out_proj(attended);
  const at::Tensor mlp = layer.fc2(activation_(layer.fc1(layer.layer_norm2(after_attention))));
  return after_attention + mlp;
}

at::Tensor ClipTextModel::eos_positions(const at::Tensor& ids) const {
  // The reference casts to int32 before argmax (an ONNX habit); ids are far below 2^31 so it changes nothing.
  const at::Tensor ids32 = ids.to(at::kInt);
  if (config_.pools_at_largest_id()) return ids32.argmax(-1);
  // First position holding eos (pad may equal eos); a row without eos pools position 0, as the reference does.
  return ids32.eq(config_.eos_token_id).to(at::kInt).argmax(-1);
}

ClipTextModel::Output ClipTextModel::forward(const at::Tensor& input_ids) const {
  c10::InferenceMode inference;
  DP_CHECK(input_ids.defined() && input_ids.dim() == 2, "CLIP text encoder: input_ids must be (batch, sequence), got ",
           input_ids.defined() ? input_ids.sizes() : at::IntArrayRef{});
  DP_CHECK(!at::isFloatingType(input_ids.scalar_type()) && input_ids.scalar_type() != at::kBool,
           "CLIP text encoder: input_ids must hold integer token ids, got ", input_ids.scalar_type());
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  DP_CHECK(seq >= 1 && seq <= config_.max_position_embeddings, "CLIP text encoder: sequence length ", seq,
           " must be in [1, max_position_embeddings = ", config_.max_position_embeddings, "]");
  if (input_ids.numel() > 0) {
    const int64_t low = input_ids.min().item<int64_t>(), high = input_ids.max().item<int64_t>();
    DP_CHECK(low >= 0 && high < config_.vocab_size, "CLIP text encoder: token ids must be in [0, ",
             config_.vocab_size, "), got range [", low, ", ", high, "]");
  }

  const at::Tensor ids = input_ids.to(device_, at::kLong);
  at::Tensor hidden = at::embedding(token_embedding_, ids) + position_embedding_.narrow(0, 0, seq).unsqueeze(0);
  for (const EncoderLayer& layer : layers_) hidden = encoder_layer(layer, hidden);
  hidden = final_layer_norm_(hidden);

  // The pooled rows are found from the ids where they came from (the host, as a rule): an argmax on the device
  // cost 74 ms of first use on an H100. The gather is index_select, the token lookup's own kernel.
  const at::Tensor rows = at::arange(batch, input_ids.options().dtype(at::kLong)) * seq +
                          eos_positions(input_ids).to(at::kLong);
  const at::Tensor pooled = hidden.reshape({batch * seq, hidden.size(2)}).index_select(0, rows.to(device_));
  return {hidden, pooled};
}

}  // namespace dp::models
