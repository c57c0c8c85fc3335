#!/usr/bin/env python3
"""Oracle for the whole FluxPipeline: tiny random pipelines saved with save_pretrained, and diffusers'
packed latents and images for a batch of prompts.

OUT/<case>/pipe/ is the pipeline folder; OUT/<case>/expected.safetensors holds `latents` (float32, what
output_type="latent" returns) and `images` (uint8 (B, H, W, 3), what output_type="pil" gives), and
OUT/<case>/case.json the call's arguments (height/width null: the pipeline's default size) plus what diffusers
derived: its vae_scale_factor and whether it warned that the size would be rounded down.

The cases vary the VAE's depth (4 blocks as FLUX.1, and 1 or 2 as diffusers' own tiny test pipelines, so
vae_scale_factor is 8, 1 or 2), the transformer's heads, head size, rotary axes and latent channels, and the
image size: multiples of 2 * vae_scale_factor, sizes diffusers rounds down, and the default size."""
import argparse
import json
import logging
import pathlib
import sys

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5TokenizerFast

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cases_tokenizers import read_corpus, write_clip_hub_folder, write_t5_spiece_folder  # noqa: E402

PROMPTS = ["a cat sipping a margarita in a pool in Palm Springs", "cinematic film still, moody, film grain"]

# The tiny transformer and VAE of a case; each case overrides some of these.
ARCHITECTURE = dict(latent_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16,
                    num_attention_heads=2, axes_dims_rope=[4, 6, 6], vae_block_out_channels=[16, 16, 32, 32],
                    vae_norm_num_groups=8, vae_mid_block_attention=True)

CASES = {
    # FLUX.1's four-block VAE: vae_scale_factor 8, sizes multiples of 16.
    "dev_like": dict(guidance=True, dynamic_shift=True, height=64, width=96, steps=4, guidance_scale=3.5, seed=7,
                     max_sequence_length=32, prompts=PROMPTS, num_images_per_prompt=2),
    "schnell_like": dict(guidance=False, dynamic_shift=False, height=48, width=32, steps=3, guidance_scale=0.0,
                         seed=11, max_sequence_length=16, prompts=PROMPTS[:1], num_images_per_prompt=1),
    # Four blocks again, at a size diffusers rounds down (72x40 -> 64x32) after its warning.
    "dev_rounded": dict(guidance=True, dynamic_shift=True, height=72, width=40, steps=2, guidance_scale=4.0, seed=5,
                        max_sequence_length=16, prompts=PROMPTS[1:], num_images_per_prompt=1,
                        num_attention_heads=3, attention_head_dim=8, axes_dims_rope=[2, 2, 4]),
    # One block: vae_scale_factor 1, so the default size is 128x128 and any even size is a multiple of 2.
    "vae1_default": dict(guidance=True, dynamic_shift=True, height=None, width=None, steps=2, guidance_scale=3.5,
                         seed=3, max_sequence_length=16, prompts=PROMPTS[:1], num_images_per_prompt=1,
                         latent_channels=8, num_attention_heads=3, attention_head_dim=12, axes_dims_rope=[4, 4, 4],
                         vae_block_out_channels=[16], vae_norm_num_groups=4, vae_mid_block_attention=False),
    "vae1_rounded": dict(guidance=False, dynamic_shift=False, height=37, width=50, steps=3, guidance_scale=0.0,
                         seed=13, max_sequence_length=16, prompts=PROMPTS[:1], num_images_per_prompt=2,
                         latent_channels=4, num_layers=2, num_single_layers=1, num_attention_heads=1,
                         attention_head_dim=16, vae_block_out_channels=[8], vae_norm_num_groups=4),
    # Two blocks: vae_scale_factor 2, sizes multiples of 4; the default size is 256x256. 48x80 is also a
    # multiple of 16, where a factor hard-wired to 8 gives a 6x10 latent grid instead of 24x40.
    "vae2_like": dict(guidance=False, dynamic_shift=True, height=48, width=80, steps=3, guidance_scale=0.0, seed=17,
                      max_sequence_length=16, prompts=PROMPTS, num_images_per_prompt=1,
                      latent_channels=4, num_layers=2, num_single_layers=1, num_attention_heads=4,
                      attention_head_dim=8, axes_dims_rope=[2, 2, 4], vae_block_out_channels=[8, 16],
                      vae_norm_num_groups=4),
    "vae2_default": dict(guidance=True, dynamic_shift=True, height=None, width=None, steps=2, guidance_scale=2.0,
                         seed=19, max_sequence_length=16, prompts=PROMPTS[:1], num_images_per_prompt=1,
                         latent_channels=8, num_attention_heads=2, attention_head_dim=20, axes_dims_rope=[4, 8, 8],
                         vae_block_out_channels=[8, 12], vae_norm_num_groups=4, vae_mid_block_attention=False),
    "vae2_rounded": dict(guidance=True, dynamic_shift=False, height=30, width=58, steps=2, guidance_scale=5.0,
                         seed=23, max_sequence_length=16, prompts=PROMPTS[1:], num_images_per_prompt=1,
                         latent_channels=4, num_attention_heads=2, attention_head_dim=8, axes_dims_rope=[2, 2, 4],
                         vae_block_out_channels=[8, 16], vae_norm_num_groups=8),
}


def jitter(model: torch.nn.Module, seed: int) -> None:
    # Zero-initialised projections (AdaLN, proj_out) would make whole paths vanish from the comparison.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)


def build_pipeline(folder: pathlib.Path, spec: dict, seed: int) -> FluxPipeline:
    arch = {**ARCHITECTURE, **{k: v for k, v in spec.items() if k in ARCHITECTURE}}
    corpus = read_corpus()
    write_clip_hub_folder(folder / "tokenizer_src", corpus)
    write_t5_spiece_folder(folder / "tokenizer_2_src", corpus)
    tokenizer = CLIPTokenizer.from_pretrained(folder / "tokenizer_src")
    tokenizer_2 = T5TokenizerFast.from_pretrained(folder / "tokenizer_2_src")
    torch.manual_seed(seed)
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37,
                                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77,
                                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                        pad_token_id=tokenizer.pad_token_id, projection_dim=32)).eval()
    t5 = T5EncoderModel(T5Config(vocab_size=len(tokenizer_2), d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                 num_heads=4, feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                 relative_attention_max_distance=16, decoder_start_token_id=0)).eval()
    # FluxPipeline draws transformer.in_channels // 4 latent channels and the VAE decodes them.
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4 * arch["latent_channels"],
                                         num_layers=arch["num_layers"], num_single_layers=arch["num_single_layers"],
                                         attention_head_dim=arch["attention_head_dim"],
                                         num_attention_heads=arch["num_attention_heads"], joint_attention_dim=32,
                                         pooled_projection_dim=32, guidance_embeds=spec["guidance"],
                                         axes_dims_rope=arch["axes_dims_rope"]).eval()
    blocks = len(arch["vae_block_out_channels"])
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=arch["latent_channels"],
                        block_out_channels=arch["vae_block_out_channels"],
                        down_block_types=["DownEncoderBlock2D"] * blocks, up_block_types=["UpDecoderBlock2D"] * blocks,
                        layers_per_block=1, norm_num_groups=arch["vae_norm_num_groups"], scaling_factor=0.3611,
                        shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                        mid_block_add_attention=arch["vae_mid_block_attention"]).eval()
    for i, model in enumerate((clip, t5, transformer, vae)):
        jitter(model, seed + i)
    if spec["dynamic_shift"]:
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                                    base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                    max_image_seq_len=4096)
    else:
        scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)
    pipe = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=clip, tokenizer=tokenizer, text_encoder_2=t5,
                        tokenizer_2=tokenizer_2, transformer=transformer)
    pipe.save_pretrained(folder / "pipe", safe_serialization=True)
    return pipe


class RecordWarnings(logging.Handler):
    """Collects what FluxPipeline logs at WARNING, such as check_inputs' size warning."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    out = pathlib.Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    warnings = RecordWarnings()
    logging.getLogger("diffusers.pipelines.flux.pipeline_flux").addHandler(warnings)
    for i, (name, spec) in enumerate(CASES.items()):
        case_dir = out / name
        pipe = build_pipeline(case_dir, spec, seed=100 + 10 * i)
        # Reload from disk, as a user would, so the comparison covers what save_pretrained wrote.
        pipe = FluxPipeline.from_pretrained(case_dir / "pipe", torch_dtype=torch.float32)
        call = dict(prompt=spec["prompts"], num_images_per_prompt=spec["num_images_per_prompt"],
                    height=spec["height"], width=spec["width"], num_inference_steps=spec["steps"],
                    guidance_scale=spec["guidance_scale"], max_sequence_length=spec["max_sequence_length"])
        warnings.messages.clear()
        final = {}

        def keep_latents(_pipe, _step, _t, tensors):
            # After the last step these are the packed latents output_type="latent" would return.
            final["latents"] = tensors["latents"]
            return tensors

        with torch.inference_mode():
            images = pipe(**call, generator=torch.Generator("cpu").manual_seed(spec["seed"]), output_type="np",
                          callback_on_step_end=keep_latents, callback_on_step_end_tensor_inputs=["latents"]).images
        latents = final["latents"]
        pixels = torch.from_numpy((images * 255).round().astype(np.uint8))
        save_file({"latents": latents.float().contiguous(), "images": pixels.contiguous()},
                  str(case_dir / "expected.safetensors"))
        derived = dict(vae_scale_factor=pipe.vae_scale_factor,
                       size_warned=any("divisible by" in m for m in warnings.messages))
        (case_dir / "case.json").write_text(json.dumps({**spec, **derived}, indent=2))
    (out / "cases.json").write_text(json.dumps(sorted(CASES)))


if __name__ == "__main__":
    main()
