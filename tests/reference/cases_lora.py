#!/usr/bin/env python3
"""Oracle for the rest of FluxPipeline's call: LoRA adapters (load_lora_weights + set_adapters), true
classifier-free guidance (negative_prompt + true_cfg_scale), custom sigmas and initial latents.

Tiny random pipelines (three transformer shapes) are saved with save_pretrained and reloaded with
from_pretrained, as users load them. Tiny random LoRA files are written in each layout diffusers reads for FLUX.1:
  diffusers/PEFT  peft.LoraConfig adapters saved with FluxPipeline.save_lora_weights (their LoraConfig in the
                  file's metadata), and hand-written ones with `alpha` keys (float32 and bfloat16 alphas, modules
                  without one), text_encoder.* keys included;
  kohya           lora_unet_double_blocks_* / lora_unet_single_blocks_* with `.alpha` (and without), a
                  block-diagonal qkv (diffusers slices its rank), an img_in key diffusers drops, lora_te1_* keys;
  BFL             the same modules under diffusion_model.double_blocks.<i>.img_attn.qkv... (ComfyUI's spelling)
                  and text_encoders.clip_l.transformer.* keys.
kohya's single-block linear1 is split by diffusers with FLUX.1's hard-coded widths (3072, 3072, 3072, 12288), so
only a transformer of FLUX.1's width loads it: the "wide" pipeline has one single block of width 3072 (and no double
block), for the linear1 cases (dense, and block-diagonal where diffusers also slices the rank).

OUT/cases.json lists the cases; OUT/<case>/case.json holds the call (prompts, possibly with <lora:...> tags,
the adapters with name, file and scale, negative prompts, sigmas, the initial latents' file) and the modes it
runs in; OUT/<case>/expected.safetensors holds `latents`, the packed latents diffusers returns (float32), and
`plain`, those of the same prompts without adapters, true CFG, custom sigmas or given latents (so a test can
tell that what it checks did something).
A case with prompt tags is run by diffusers one prompt at a time with set_adapters per prompt, from the same
initial latents (OUT/<case>/latents.h5)."""
import argparse
import json
import pathlib
import sys

import h5py
import torch
from diffusers import FluxPipeline
from peft import LoraConfig
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cases_pipeline import build_pipeline  # noqa: E402

PROMPTS = ["a cat sipping a margarita in a pool in Palm Springs", "cinematic film still, moody, film grain"]

PIPELINES = {
    # As FLUX.1-dev: guidance embedding, dynamic shift; 2 heads of 16.
    "dev": dict(guidance=True, dynamic_shift=True, num_layers=1, num_single_layers=2, num_attention_heads=2,
                attention_head_dim=16, axes_dims_rope=[4, 6, 6], vae_block_out_channels=[8, 16],
                vae_norm_num_groups=4),
    # As FLUX.1-schnell: no guidance embedding; 3 heads of 8, two double blocks.
    "schnell": dict(guidance=False, dynamic_shift=False, num_layers=2, num_single_layers=1, num_attention_heads=3,
                    attention_head_dim=8, axes_dims_rope=[2, 2, 4], latent_channels=4, vae_block_out_channels=[8],
                    vae_norm_num_groups=4),
    # FLUX.1's width (24 heads of 128) for kohya's linear1, which diffusers splits with FLUX.1's widths: one single
    # block and no double block keep it small (190M parameters).
    "wide": dict(guidance=True, dynamic_shift=True, num_layers=0, num_single_layers=1, num_attention_heads=24,
                 attention_head_dim=128, axes_dims_rope=[16, 56, 56], latent_channels=4, vae_block_out_channels=[8],
                 vae_norm_num_groups=4),
    # 4 heads of 8, one block of each kind, 8 latent channels.
    "narrow": dict(guidance=True, dynamic_shift=True, num_layers=1, num_single_layers=1, num_attention_heads=4,
                   attention_head_dim=8, axes_dims_rope=[2, 2, 4], latent_channels=8, vae_block_out_channels=[8, 16],
                   vae_norm_num_groups=4),
}

CALL = dict(height=32, width=48, steps=3, guidance_scale=3.5, seed=7, max_sequence_length=16, num_images_per_prompt=1)

DOUBLE_BFL = {"img_attn_qkv": "img_attn.qkv", "img_attn_proj": "img_attn.proj", "img_mlp_0": "img_mlp.0",
              "img_mlp_2": "img_mlp.2", "img_mod_lin": "img_mod.lin", "txt_attn_qkv": "txt_attn.qkv",
              "txt_attn_proj": "txt_attn.proj", "txt_mlp_0": "txt_mlp.0", "txt_mlp_2": "txt_mlp.2",
              "txt_mod_lin": "txt_mod.lin"}
SINGLE_BFL = {"linear2": "linear2", "modulation_lin": "modulation.lin"}


def widths(transformer):
    c = transformer.config
    d = c.num_attention_heads * c.attention_head_dim
    return d, 4 * d


def factors(gen, rank, n_in, n_out, dtype=torch.float32):
    down = (torch.randn(rank, n_in, generator=gen) * 0.15).to(dtype)
    up = (torch.randn(n_out, rank, generator=gen) * 0.1).to(dtype)
    return down, up


def kohya_lora(transformer, clip, seed, bfl=False, rank=4):
    """kohya (lora_unet_...) or BFL (diffusion_model....) keys for every double-block module and the single
    blocks' linear2 and modulation, with alphas on some, a block-diagonal qkv, and CLIP keys."""
    gen = torch.Generator().manual_seed(seed)
    d, mlp = widths(transformer)
    sizes = {"img_attn_qkv": (d, 3 * d), "img_attn_proj": (d, d), "img_mlp_0": (d, mlp), "img_mlp_2": (mlp, d),
             "img_mod_lin": (d, 6 * d)}
    sizes.update({k.replace("img", "txt"): v for k, v in sizes.items()})
    sd = {}

    def put(kohya_name, bfl_name, n_in, n_out, alpha=None, block_diagonal=False, r=rank, rows=None):
        name = f"diffusion_model.{bfl_name}" if bfl else f"lora_unet_{kohya_name}"
        down, up = factors(gen, r, n_in, n_out)
        if block_diagonal:  # diffusers then gives each part (q, k, v [, mlp]) its slice of the rank
            rows = rows or [n_out // 3] * 3
            part = r // len(rows)
            mask = torch.zeros(n_out, r)
            first = 0
            for j, count in enumerate(rows):
                mask[first:first + count, j * part:(j + 1) * part] = 1
                first += count
            up = up * mask
        sd[f"{name}.lora_down.weight"], sd[f"{name}.lora_up.weight"] = down, up
        if alpha is not None:
            sd[f"{name}.alpha"] = torch.tensor(alpha, dtype=torch.bfloat16 if bfl else torch.float32)

    for i in range(transformer.config.num_layers):
        for j, (kohya, (n_in, n_out)) in enumerate(sizes.items()):
            qkv = kohya.endswith("qkv")
            put(f"double_blocks_{i}_{kohya}", f"double_blocks.{i}.{DOUBLE_BFL[kohya]}", n_in, n_out,
                alpha=[None, 2.0, 8.0, 1.0][(i + j) % 4], block_diagonal=qkv and i == 0 and kohya.startswith("img"),
                r=6 if qkv else rank)
    for i in range(transformer.config.num_single_layers):
        if d == 3072:  # the only width diffusers can split linear1 for
            put(f"single_blocks_{i}_linear1", f"single_blocks.{i}.linear1", d, 3 * d + mlp, alpha=[4.0, None][bfl],
                block_diagonal=bfl, r=8, rows=[d, d, d, mlp])
        put(f"single_blocks_{i}_linear2", f"single_blocks.{i}.linear2", d + mlp, d, alpha=3.0)
        put(f"single_blocks_{i}_modulation_lin", f"single_blocks.{i}.modulation.lin", d, 3 * d)
    # diffusers 0.42.1 converts kohya embedder keys outside "transformer." and never loads them.
    put("img_in", "img_in", transformer.config.in_channels, d, alpha=4.0)
    h, inter = clip.config.hidden_size, clip.config.intermediate_size
    for i in range(clip.config.num_hidden_layers):
        for proj, (n_in, n_out) in {"self_attn_q_proj": (h, h), "self_attn_out_proj": (h, h), "mlp_fc1": (h, inter),
                                    "mlp_fc2": (inter, h)}.items():
            down, up = factors(gen, rank, n_in, n_out)
            if bfl:
                module = {"self_attn_q_proj": "self_attn.q_proj", "self_attn_out_proj": "self_attn.out_proj",
                          "mlp_fc1": "mlp.fc1", "mlp_fc2": "mlp.fc2"}[proj]
                name = f"text_encoders.clip_l.transformer.text_model.encoder.layers.{i}.{module}"
            else:
                name = f"lora_te1_text_model_encoder_layers_{i}_{proj}"
            sd[f"{name}.lora_down.weight"], sd[f"{name}.lora_up.weight"] = down, up
            if i == 0:
                sd[f"{name}.alpha"] = torch.tensor(2.0)
    return sd


def alpha_lora(transformer, clip, seed, rank=4):
    """diffusers/PEFT keys written by hand, with alpha keys as many files carry them: float32 and bfloat16
    alphas, modules without one, ranks that differ, and text_encoder keys with the `text_model.` level."""
    gen = torch.Generator().manual_seed(seed)
    d, mlp = widths(transformer)
    sd = {}
    modules = {"transformer_blocks.0.attn.to_q": (d, d, 8.0, rank), "transformer_blocks.0.attn.to_k": (d, d, None, rank),
               "transformer_blocks.0.attn.add_v_proj": (d, d, 2.0, 2),
               "transformer_blocks.0.ff_context.net.0.proj": (d, mlp, 1.0, rank),
               "single_transformer_blocks.0.proj_mlp": (d, mlp, 6.0, rank),
               "single_transformer_blocks.0.attn.to_v": (d, d, None, 3),
               "context_embedder": (transformer.config.joint_attention_dim, d, 4.0, rank)}
    for i, (module, (n_in, n_out, alpha, r)) in enumerate(modules.items()):
        down, up = factors(gen, r, n_in, n_out)
        sd[f"transformer.{module}.lora_A.weight"], sd[f"transformer.{module}.lora_B.weight"] = down, up
        if alpha is not None:
            sd[f"transformer.{module}.alpha"] = torch.tensor(alpha, dtype=torch.bfloat16 if i % 2 else torch.float32)
    h = clip.config.hidden_size
    for i in range(clip.config.num_hidden_layers):
        down, up = factors(gen, rank, h, h)
        sd[f"text_encoder.text_model.encoder.layers.{i}.self_attn.v_proj.lora_A.weight"] = down
        sd[f"text_encoder.text_model.encoder.layers.{i}.self_attn.v_proj.lora_B.weight"] = up
        sd[f"text_encoder.text_model.encoder.layers.{i}.self_attn.v_proj.alpha"] = torch.tensor(8.0 if i else 2.0)
    return sd


def save_peft_lora(pipe, path, seed):
    """A PEFT adapter on the transformer saved as diffusers' trainers save one: FluxPipeline.save_lora_weights,
    its LoraConfig in the metadata (rank and alpha patterns included)."""
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_v", "to_out.0", "proj_mlp", "proj_out",
                                                           "norm1.linear", "ff.net.2", "x_embedder", "norm_out.linear"],
                        rank_pattern={"^proj_out": 2}, alpha_pattern={"norm1.linear": 2}, init_lora_weights=False)
    transformer = pipe.transformer
    transformer.add_adapter(config, adapter_name="saved")
    gen = torch.Generator().manual_seed(seed)
    from peft.utils import get_peft_model_state_dict
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.15 if "lora_A" in name else 0.1))
    state = get_peft_model_state_dict(transformer, adapter_name="saved")
    FluxPipeline.save_lora_weights(path.parent, transformer_lora_layers=state, weight_name=path.name,
                                   transformer_lora_adapter_metadata=config.to_dict())
    transformer.delete_adapters("saved")


def make_adapters(folder, pipe, seed, kinds):
    """The LoRA files of one pipeline, by kind (those of `kinds`)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    if "peft" in kinds:
        files["peft"] = folder / "peft.safetensors"
        save_peft_lora(pipe, files["peft"], seed)
    makers = {"alpha": lambda: alpha_lora(pipe.transformer, pipe.text_encoder, seed + 1),
              "kohya": lambda: kohya_lora(pipe.transformer, pipe.text_encoder, seed + 2),
              "bfl": lambda: kohya_lora(pipe.transformer, pipe.text_encoder, seed + 3, bfl=True)}
    for kind, make in makers.items():
        if kind not in kinds:
            continue
        files[kind] = folder / f"{kind}.safetensors"
        save_file({k: v.contiguous() for k, v in make().items()}, str(files[kind]))
    return files


# name -> (pipeline, [(adapter kind, scale)], modes, extra call arguments)
CASES = {
    "peft_1": ("dev", [("peft", 0.7)], ["fused", "unfused"], {}),
    "peft_alpha_2": ("dev", [("peft", 0.7), ("alpha", 1.3)], ["fused", "unfused"], {}),
    "kohya_1": ("schnell", [("kohya", 1.3)], ["fused", "unfused"], {}),
    "kohya_bfl_2": ("schnell", [("kohya", 0.7), ("bfl", 1.3)], ["fused", "unfused"], {}),
    "bfl_1": ("narrow", [("bfl", 0.7)], ["fused", "unfused"], {}),
    "bfl_alpha_2": ("narrow", [("bfl", 1.3), ("alpha", 0.7)], ["fused", "unfused"], {"num_images_per_prompt": 2}),
    "true_cfg": ("dev", [], ["fused"], {"negative_prompt": ["blurry, low quality"], "true_cfg_scale": 4.0}),
    "true_cfg_lora": ("schnell", [("kohya", 0.7)], ["fused", "unfused"],
                      {"negative_prompt": ["blurry", "oversaturated"], "true_cfg_scale": 2.5,
                       "num_images_per_prompt": 2}),
    "sigmas": ("dev", [], ["fused"], {"sigmas": [1.0, 0.8, 0.45, 0.2]}),
    "sigmas_cfg_alpha": ("narrow", [("alpha", 1.3)], ["unfused"],
                         {"sigmas": [0.9, 0.5, 0.15], "negative_prompt": ["noise"], "true_cfg_scale": 3.0}),
    "latents": ("narrow", [], ["fused"], {"latents": True, "num_images_per_prompt": 2}),
    # linear1 split into to_q, to_k, to_v and proj_mlp: kohya's dense, BFL's block-diagonal.
    "linear1_kohya_bfl": ("wide", [("kohya", 1.3), ("bfl", 0.7)], ["fused", "unfused"], {"height": 16, "width": 16}),
    # Each prompt chooses its adapters (unfused only); diffusers runs them one by one from the same latents.
    "prompt_tags": ("dev", [("kohya", 0.7), ("alpha", 1.3)], ["unfused"],
                    {"tags": ["<lora:kohya:1.3> ", "<lora:alpha> <lora:kohya:0.5> ", "<lora:none> ", ""],
                     "latents": True}),
}


def run_diffusers(pipe, call, prompts, latents=None):
    kwargs = dict(prompt=prompts, height=call["height"], width=call["width"],
                  num_inference_steps=len(call["sigmas"]) if call.get("sigmas") else call["steps"],
                  guidance_scale=call["guidance_scale"], max_sequence_length=call["max_sequence_length"],
                  num_images_per_prompt=call["num_images_per_prompt"], output_type="latent")
    if call.get("sigmas"):
        kwargs["sigmas"] = call["sigmas"]
    if call.get("negative_prompt"):
        negative = call["negative_prompt"]
        kwargs["negative_prompt"] = negative * len(prompts) if len(negative) == 1 else negative
        kwargs["true_cfg_scale"] = call["true_cfg_scale"]
    if latents is not None:
        kwargs["latents"] = latents
    with torch.inference_mode():
        return pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(call["seed"])).images.float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    adapters = {}
    for i, (name, spec) in enumerate(PIPELINES.items()):
        folder = out / "pipelines" / name
        pipe = build_pipeline(folder, spec, seed=300 + 10 * i)
        pipe = FluxPipeline.from_pretrained(folder / "pipe", torch_dtype=torch.float32)
        kinds = {kind for pipeline, chosen, _, _ in CASES.values() if pipeline == name for kind, _ in chosen}
        adapters[name] = make_adapters(folder / "adapters", pipe, 400 + 10 * i, kinds)
    for name, (pipeline, chosen, modes, extra) in CASES.items():
        case_dir = out / name
        case_dir.mkdir(parents=True, exist_ok=True)
        call = {**CALL, **{k: v for k, v in extra.items() if k not in ("tags", "latents")}}
        folder = out / "pipelines" / pipeline / "pipe"
        pipe = FluxPipeline.from_pretrained(folder, torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        tags = extra.get("tags")
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(tags))] if tags else PROMPTS
        latents = None
        if extra.get("latents"):
            c = pipe.transformer.config
            tokens = (call["height"] // pipe.vae_scale_factor // 2) * (call["width"] // pipe.vae_scale_factor // 2)
            gen = torch.Generator().manual_seed(call["seed"] + 1)
            latents = torch.randn(len(prompts) * call["num_images_per_prompt"], tokens, c.in_channels, generator=gen)
            with h5py.File(case_dir / "latents.h5", "w") as f:
                f["latents"] = latents.numpy()
        # The plain call (no adapters, no true CFG, default sigmas, seeded latents): what each case must differ from.
        plain = run_diffusers(pipe, {**CALL, **{k: call[k] for k in ("num_images_per_prompt", "height", "width")}},
                              prompts)
        names = []
        for kind, scale in chosen:
            pipe.load_lora_weights(str(adapters[pipeline][kind]), adapter_name=kind)
            names.append(kind)
        if names:
            pipe.set_adapters(names, [scale for _, scale in chosen])
        if tags:
            n = call["num_images_per_prompt"]
            rows = []
            for p, tag in enumerate(tags):
                # The adapters this prompt's tags choose, at the scales they give (a bare name: its --lora scale).
                weights = {kind: 0.0 for kind in names} if tag else {kind: s for kind, s in chosen}
                for t in tag.split():
                    body = t[len("<lora:"):-1]
                    if body == "none":
                        continue
                    kind, _, scale = body.partition(":")
                    weights[kind] = float(scale) if scale else dict(chosen)[kind]
                pipe.set_adapters(list(weights), list(weights.values()))
                rows.append(run_diffusers(pipe, call, [prompts[p]], latents[p * n:(p + 1) * n]))
            expected = torch.cat(rows, 0)
        else:
            expected = run_diffusers(pipe, call, prompts, latents)
        save_file({"latents": expected.contiguous(), "plain": plain.contiguous()},
                  str(case_dir / "expected.safetensors"))
        case = dict(pipeline=str(folder), modes=modes, call=call,
                    prompts=[t + p for t, p in zip(tags, prompts)] if tags else prompts,
                    adapters=[dict(name=kind, path=str(adapters[pipeline][kind]), scale=scale) for kind, scale in chosen],
                    latents=str(case_dir / "latents.h5") if latents is not None else None)
        (case_dir / "case.json").write_text(json.dumps(case, indent=2))
        print(f"{name}: {len(chosen)} adapter(s), modes {modes}, latents {tuple(expected.shape)}, "
              f"differ from the plain call by {float((expected - plain).abs().max() / plain.abs().max()):.3g} of its scale",
              flush=True)
    (out / "cases.json").write_text(json.dumps(sorted(CASES)))


if __name__ == "__main__":
    main()
