#!/usr/bin/env python3
"""Oracle for src/placement: the device maps the pinned diffusers/accelerate compute for FLUX transformers.

Models are built on the meta device (accelerate.init_empty_weights) under the run dtype, exactly as
diffusers' ModelMixin.from_pretrained builds them before it calls _determine_device_map, and the map is
taken from that same function, so every argument (no_split_module_classes, dtype, special_dtypes, low_zero,
max_memory handling) is diffusers' own. Pipeline-level "balanced" uses diffusers' component assignment on
component sizes computed as _get_final_device_map computes them.

Writes into --out:
  configs/<name>.json        transformer config.json for each architecture
  modules/<name>.json        named_modules (name, class, own parameters) and named_parameters (name, shape)
  cases.json                 model-level cases: config, dtype, strategy, max_memory, accelerate's hf_device_map
  ours_cases.json            NOT oracle outputs: the model-level settings where accelerate raises instead of
                             giving a map ("disk" in max_memory), its error, and the map diffpipe's own rule
                             gives there (computed with accelerate's pieces, but a choice of ours)
  pipeline_tiny/             a tiny FLUX pipeline folder saved with save_pretrained (real tiny weights)
  pipeline_cases.json        pipeline-level cases: max_memory, component sizes, diffusers' map
  flux_dev_pipeline/         FLUX.1-dev's model_index.json and component configs (no weights)
  flux_dev_pipeline_cases.json  FluxPipeline.from_pretrained(device_map="balanced") on that folder, every
                             component by default: sizes per dtype and _get_final_device_map's own map
"""
import argparse
import copy
import json
import logging
import pathlib

import accelerate
import torch
from accelerate import infer_auto_device_map
from accelerate.utils import compute_module_sizes, get_balanced_memory, get_max_memory
from diffusers import AutoencoderKL, FluxTransformer2DModel
from diffusers.models.model_loading_utils import _determine_device_map
from diffusers import FluxPipeline
from diffusers import pipelines as diffusers_pipelines
from diffusers.pipelines.pipeline_loading_utils import (ALL_IMPORTABLE_CLASSES, _assign_components_to_devices,
                                                        _get_final_device_map, _load_empty_model)
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
STRATEGIES = ["auto", "balanced", "balanced_low_0", "sequential"]

FLUX_DEV = dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=[16, 56, 56])
TINY = {
    "tiny_guided": dict(patch_size=1, in_channels=8, out_channels=None, num_layers=2, num_single_layers=4,
                        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                        pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=[4, 6, 6]),
    "tiny_schnell": dict(patch_size=1, in_channels=16, out_channels=None, num_layers=3, num_single_layers=5,
                         attention_head_dim=8, num_attention_heads=4, joint_attention_dim=24,
                         pooled_projection_dim=12, guidance_embeds=False, axes_dims_rope=[2, 2, 4]),
    "tiny_single_only": dict(patch_size=2, in_channels=4, out_channels=8, num_layers=0, num_single_layers=3,
                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=16,
                             pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=[4, 6, 6]),
    "tiny_double_only": dict(patch_size=1, in_channels=8, out_channels=None, num_layers=4, num_single_layers=0,
                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                             pooled_projection_dim=16, guidance_embeds=False, axes_dims_rope=[4, 6, 6]),
}


def build_meta_flux(config, dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with accelerate.init_empty_weights():
            model = FluxTransformer2DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    return model


def module_listing(model):
    modules = [[name, type(m).__name__, [p for p, _ in m.named_parameters(recurse=False)]]
               for name, m in model.named_modules()]
    parameters = [[name, list(p.shape)] for name, p in model.named_parameters()]
    buffers = [name for name, _ in model.named_buffers()]
    return {"modules": modules, "parameters": parameters, "buffers": buffers}


def device_map_of(model, strategy, max_memory, dtype):
    """accelerate's map as [key, device] pairs, or None with accelerate's error when it raises instead.

    accelerate's get_balanced_memory crashes on a "disk" key (torch.device("disk")); only those cases may
    fail, and they go to ours_cases.json, never to the oracle's cases."""
    try:
        # _determine_device_map mutates what it is given; the case keeps the user's original values.
        result = _determine_device_map(model, strategy, copy.deepcopy(max_memory), dtype, [], None)
    except RuntimeError as e:
        if "disk" not in max_memory or strategy == "sequential":
            raise
        return None, str(e).splitlines()[0]
    return [[key, value] for key, value in result.items()], None


def our_disk_rule_map(model, strategy, max_memory, dtype):
    """diffpipe's choice where accelerate crashes: balance the budgets with "disk" left out, put "disk" back,
    then walk as accelerate walks. Not an oracle output: accelerate itself gives no map here."""
    without_disk = {k: v for k, v in copy.deepcopy(max_memory).items() if k != "disk"}
    balanced = get_balanced_memory(model, max_memory=without_disk, dtype=dtype, special_dtypes={},
                                   low_zero=(strategy == "balanced_low_0"),
                                   no_split_module_classes=model._get_no_split_modules(strategy))
    balanced["disk"] = max_memory["disk"]
    result = infer_auto_device_map(model, max_memory=balanced, dtype=dtype, special_dtypes={},
                                   no_split_module_classes=model._get_no_split_modules(strategy))
    return [[key, value] for key, value in result.items()]


def flux_dev_memory_settings():
    return [
        {0: "141GB", 1: "141GB"},
        {0: "16GB", 1: "16GB", "cpu": "64GB"},
        {0: "10GiB", 1: "10GiB", "cpu": "3GB"},
        {0: "141GB", 1: "141GB", 2: "141GB"},
        {0: "141GB", 1: "141GB", 2: "141GB", 3: "141GB"},
        {i: "141GB" for i in range(8)},
        {0: "24GB", "cpu": "64GB"},
        {0: "20GB", 1: 0, 2: "20GB", "cpu": "64GB"},
        {0: "8GB", 1: "12GB", 2: 5_000_000_000, "cpu": "4GB", "disk": "100GB"},
    ]


def tiny_memory_settings(total):
    return [
        {0: total * 2},
        {0: int(total * 0.6), 1: int(total * 0.6)},
        {0: total // 3, 1: total // 3, 2: total // 3, "cpu": total},
        {0: int(total * 0.3), 1: int(total * 0.3), "cpu": int(total * 0.2)},
        {0: total // 20, 1: total // 20, "cpu": total // 20},
        {0: 0, 1: total // 2, 2: total // 2, "cpu": total},
        {0: 3000, "cpu": 5000},
    ]


def model_cases(out):
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "modules").mkdir(parents=True, exist_ok=True)
    cases, ours = [], []
    architectures = [("flux_dev", FLUX_DEV, ["bfloat16", "float32"])] + [
        (name, cfg, ["bfloat16", "float32"]) for name, cfg in TINY.items()]
    for name, config, dtypes in architectures:
        (out / "configs" / f"{name}.json").write_text(
            json.dumps(dict(_class_name="FluxTransformer2DModel", **config), indent=2))
        listing_written = False
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            model = build_meta_flux(config, dtype)
            if not listing_written:
                (out / "modules" / f"{name}.json").write_text(json.dumps(module_listing(model)))
                listing_written = True
            total = compute_module_sizes(model, dtype=dtype)[""]
            if name == "flux_dev":
                settings = flux_dev_memory_settings() if dtype_name == "bfloat16" else [
                    {0: "30GB", 1: "30GB", "cpu": "100GB"}, {0: "141GB", 1: "141GB", 2: "141GB", 3: "141GB"}]
            else:
                settings = tiny_memory_settings(total)
            for max_memory in settings:
                for strategy in STRATEGIES:
                    expected, error = device_map_of(model, strategy, max_memory, dtype)
                    case = {"config": name, "dtype": dtype_name, "strategy": strategy,
                            "max_memory": {str(k): v for k, v in max_memory.items()}, "total_bytes": total}
                    if error is None:
                        cases.append(dict(case, expected=expected))
                    else:
                        ours.append(dict(case, accelerate_error=error,
                                         our_rule=our_disk_rule_map(model, strategy, max_memory, dtype)))
    (out / "cases.json").write_text(json.dumps(cases, indent=1))
    (out / "ours_cases.json").write_text(json.dumps(ours, indent=1))
    print(f"[placement] {len(cases)} model-level cases from accelerate; {len(ours)} settings where accelerate "
          f"raises, kept apart with diffpipe's own rule")


def diffusers_component_sizes(folder, index, dtype):
    """Component sizes exactly as _get_final_device_map computes them: every model of model_index.json built
    empty from its config by diffusers' own _load_empty_model, sized by compute_module_sizes at the run dtype.
    (Built empty, T5's encoder.embed_tokens is a second table, not shared.weight.)"""
    sizes = {}
    for name, entry in index.items():
        if name.startswith("_") or entry[0] is None:
            continue
        library, class_name = entry
        module = _load_empty_model(library_name=library, class_name=class_name,
                                   importable_classes=ALL_IMPORTABLE_CLASSES, pipelines=diffusers_pipelines,
                                   is_pipeline_module=hasattr(diffusers_pipelines, library), name=name, dtype=dtype,
                                   cached_folder=str(folder))
        if isinstance(module, torch.nn.Module):
            sizes[name] = compute_module_sizes(module, dtype=dtype)[""]
    return sizes


def tiny_pipeline(out):
    """A tiny FLUX pipeline with real (random, tiny) weights, and diffusers' pipeline-level 'balanced'."""
    folder = out / "pipeline_tiny"
    torch.manual_seed(0)
    dtype = torch.bfloat16
    components = {
        "transformer": FluxTransformer2DModel(**TINY["tiny_guided"]),
        "text_encoder": CLIPTextModel(CLIPTextConfig(
            vocab_size=1000, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=77, projection_dim=16)),
        "text_encoder_2": T5EncoderModel(T5Config(
            vocab_size=1000, d_model=48, d_ff=96, d_kv=8, num_layers=3, num_heads=6,
            feed_forward_proj="gated-gelu", relative_attention_num_buckets=8)),
        "vae": AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 2,
                             up_block_types=["UpDecoderBlock2D"] * 2, block_out_channels=[8, 16],
                             layers_per_block=1, latent_channels=4, norm_num_groups=4, use_quant_conv=False,
                             use_post_quant_conv=False),
    }
    index = {"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1"}
    libraries = {"transformer": "diffusers", "vae": "diffusers", "text_encoder": "transformers",
                 "text_encoder_2": "transformers"}
    for name, module in components.items():
        module.to(dtype).save_pretrained(folder / name, safe_serialization=True)
        index[name] = [libraries[name], type(module).__name__]
    index["scheduler"] = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))

    sizes = diffusers_component_sizes(folder, index, dtype)
    buffers = {name: [n for n, _ in module.named_buffers()] for name, module in components.items()}
    cases = []
    subsets = [["text_encoder", "text_encoder_2"], ["transformer", "text_encoder", "text_encoder_2", "vae"]]
    t5, clip, flux, vae = sizes["text_encoder_2"], sizes["text_encoder"], sizes["transformer"], sizes["vae"]
    settings = [
        {0: "16GB", 1: "16GB"},
        {0: t5 + clip, 1: t5},
        {0: t5, 1: clip - 1},
        {0: clip, 1: clip, "cpu": 10 * t5},
        {0: 100, 1: 100},
        {0: flux + vae, 1: t5 + clip, 2: t5},
        {0: 10 * flux, 1: 10 * flux, 2: 10 * flux, 3: 10 * flux},
        {1: t5 + clip + flux, 0: flux},
    ]
    for subset in subsets:
        for max_memory in settings:
            ordered = dict(sorted(((n, sizes[n]) for n in subset), key=lambda item: item[1], reverse=True))
            memory = get_max_memory(copy.deepcopy(max_memory))
            memory = dict(sorted(memory.items(), key=lambda item: item[1], reverse=True))
            memory = {k: v for k, v in memory.items() if k != "cpu"}
            mapping = _assign_components_to_devices(ordered, memory, device_mapping_strategy="balanced")
            diffusers_map = {c: d for d, comps in mapping.items() for c in comps}
            cases.append({"components": subset, "dtype": "bfloat16",
                          "max_memory": {str(k): v for k, v in max_memory.items()},
                          "diffusers_map": diffusers_map})
    (out / "pipeline_cases.json").write_text(json.dumps({"sizes": sizes, "buffers": buffers, "cases": cases},
                                                        indent=1))
    print(f"[placement] {len(cases)} pipeline-level cases; component sizes {sizes}")


# FLUX.1-dev's component configs (black-forest-labs/FLUX.1-dev): CLIP and the VAE with the fields that decide
# sizes, T5 in full.
FLUX_DEV_CLIP = dict(architectures=["CLIPTextModel"], model_type="clip_text_model", vocab_size=49408,
                     hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                     max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, projection_dim=768,
                     bos_token_id=0, eos_token_id=2, pad_token_id=1, torch_dtype="bfloat16")
# text_encoder_2/config.json of FLUX.1-dev as published (the same document models_text_encoders_test parses).
# Built empty, T5EncoderModel has encoder.embed_tokens as a second table whether tie_word_embeddings is true
# or false (diffusers sizes 9,787,813,888 bytes in bf16 both ways); loaded, it is shared.weight both ways.
FLUX_DEV_T5 = dict(architectures=["T5EncoderModel"], classifier_dropout=0.0, d_ff=10240, d_kv=64, d_model=4096,
                   decoder_start_token_id=0, dense_act_fn="gelu_new", dropout_rate=0.1, eos_token_id=1,
                   feed_forward_proj="gated-gelu", initializer_factor=1.0, is_encoder_decoder=True,
                   is_gated_act=True, layer_norm_epsilon=1e-6, model_type="t5", num_decoder_layers=24,
                   num_heads=64, num_layers=24, output_past=True, pad_token_id=0,
                   relative_attention_max_distance=128, relative_attention_num_buckets=32,
                   tie_word_embeddings=False, torch_dtype="bfloat16", use_cache=True, vocab_size=32128)
FLUX_DEV_VAE = dict(_class_name="AutoencoderKL", in_channels=3, out_channels=3,
                    down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                    block_out_channels=[128, 256, 512, 512], layers_per_block=2, act_fn="silu", latent_channels=16,
                    norm_num_groups=32, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
                    use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True, force_upcast=True)


def flux_dev_pipeline(out):
    """Pipeline-level "balanced" for the full FLUX.1-dev folder with no component left out, as
    FluxPipeline.from_pretrained(folder, device_map="balanced", max_memory=...) computes it: diffusers'
    _get_final_device_map builds every component of model_index.json empty from its config and sizes the
    nn.Modules among them (transformer and vae included, tokenizers and scheduler not)."""
    folder = out / "flux_dev_pipeline"
    index = {"_class_name": "FluxPipeline", "_diffusers_version": "0.42.1",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    configs = {"text_encoder": FLUX_DEV_CLIP, "text_encoder_2": FLUX_DEV_T5,
               "transformer": dict(_class_name="FluxTransformer2DModel", **FLUX_DEV), "vae": FLUX_DEV_VAE}
    for name, config in configs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    init_dict = {k: v for k, v in index.items() if not k.startswith("_")}

    settings = [
        ("bfloat16", {0: "141GB", 1: "141GB"}),
        ("bfloat16", {0: "16GB", 1: "16GB"}),  # the seed's budgets: the transformer does not fit
        ("bfloat16", {0: "24GB", 1: "16GB", "cpu": "64GB"}),
        ("bfloat16", {0: "141GB"}),
        ("bfloat16", {0: "141GB", 1: "141GB", 2: "141GB", 3: "141GB"}),
        ("bfloat16", {0: "10GB", 1: "10GB"}),
        ("bfloat16", {0: "8GB", 1: "8GB"}),  # transformer and T5 both miss: diffusers' overwrite bug
        ("bfloat16", {0: "9.6GB", 1: "9.6GB"}),  # T5 fits once loaded (9.52 GB), not as diffusers sizes it
        ("bfloat16", {0: "12GB", 1: "30GB"}),  # GPU 1 has the larger budget, so it is visited first
        ("float32", {0: "80GB", 1: "80GB"}),
        ("float32", {0: "48GB", 1: "20GB", 2: "2GB"}),
    ]
    sizes, cases = {}, []
    for dtype_name, max_memory in settings:
        dtype = DTYPES[dtype_name]
        final = _get_final_device_map("balanced", FluxPipeline, {}, dict(init_dict), None, copy.deepcopy(max_memory),
                                      dtype=dtype, cached_folder=str(folder))
        if dtype_name not in sizes:
            sizes[dtype_name] = diffusers_component_sizes(folder, index, dtype)
        cases.append({"dtype": dtype_name, "max_memory": {str(k): v for k, v in max_memory.items()},
                      "diffusers_map": final})
    (out / "flux_dev_pipeline_cases.json").write_text(json.dumps({"sizes": sizes, "cases": cases}, indent=1))
    print(f"[placement] {len(cases)} FLUX.1-dev pipeline-level cases; component sizes {sizes}")


def main():
    # accelerate warns that the GPUs named in max_memory are absent: the oracle plans without GPUs on purpose.
    logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_cases(out)
    tiny_pipeline(out)
    flux_dev_pipeline(out)


if __name__ == "__main__":
    main()
