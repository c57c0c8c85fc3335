#pragma once
// The pieces of a tiny random FLUX pipeline besides the transformer: the parameter lists and config.json
// documents of the CLIP text encoder, the T5 encoder and the VAE (the keys and fields transformers' and
// diffusers' save_pretrained write), the scheduler config, model_index.json, and two tokenizer folders
// small enough to build offline yet loadable by transformers and by our tokenizers.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "models/clip_text_model.h"
#include "models/flux_config.h"
#include "models/t5_encoder.h"
#include "models/vae.h"

namespace dp::pipeline {

// The config.json spelling of a weight dtype ("float32", "bfloat16", "float16"); other dtypes are refused.
std::string torch_dtype_name(io::DType dtype);

// Checkpoint keys and shapes, exactly those save_pretrained writes (and our loaders read).
// CLIPTextModel as transformers 5 saves it: no "text_model." prefix.
std::vector<models::ParameterShape> clip_text_parameter_shapes(const models::ClipTextConfig& config);
// T5EncoderModel: the token embedding only as "shared.weight" (tied to encoder.embed_tokens).
std::vector<models::ParameterShape> t5_encoder_parameter_shapes(const models::T5Config& config);
// AutoencoderKL: encoder and decoder, and the quant convolutions the config enables.
std::vector<models::ParameterShape> vae_parameter_shapes(const models::VaeConfig& config);

// config.json documents. torch_dtype names the stored dtype as transformers writes it ("float32", ...).
nlohmann::json clip_text_config_json(const models::ClipTextConfig& config, const std::string& torch_dtype);
nlohmann::json t5_encoder_config_json(const models::T5Config& config, const std::string& torch_dtype);
nlohmann::json vae_config_json(const models::VaeConfig& config);
// FLUX.1-dev's FlowMatchEulerDiscreteScheduler, every field diffusers 0.42.1 writes.
nlohmann::json flux_scheduler_config_json();
// model_index.json of a FluxPipeline as diffusers 0.42.1 with transformers 5 saves it.
nlohmann::json flux_model_index_json();

// The ids a tokenizer folder defines, for the text encoders' configs.
struct TinyTokenizerInfo {
  int64_t vocab_size = 0;
  int64_t bos_id = -1;  // -1: none (T5)
  int64_t eos_id = -1;
  int64_t pad_id = -1;
};

// CLIP byte-level BPE in FLUX.1-dev's tokenizer/ layout: vocab.json (the 256 byte symbols, their "</w>"
// forms, merges learned on a built-in English word list, then <|startoftext|> and <|endoftext|>),
// merges.txt, tokenizer_config.json and special_tokens_map.json. Creates dir.
TinyTokenizerInfo write_tiny_clip_tokenizer(const std::string& dir);
// T5 as tokenizer.json with a Unigram model (<pad>, </s>, <unk>, "▁", single characters, common words with
// "▁" and descending scores, then <extra_id_99> ... <extra_id_0>), tokenizer_config.json and
// special_tokens_map.json. No normalizer: real T5 folders carry sentencepiece's precompiled NFKC charsmap,
// which a tiny ASCII vocabulary does not need. Creates dir.
TinyTokenizerInfo write_tiny_t5_tokenizer(const std::string& dir);

}  // namespace dp::pipeline
