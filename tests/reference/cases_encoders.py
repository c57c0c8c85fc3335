#!/usr/bin/env python3
"""Oracle for the text encoders (CLIPTextModel, T5EncoderModel) and the AutoencoderKL.

For every case it writes OUT/<case>/model/ (save_pretrained, safetensors) and OUT/<case>/io.safetensors
holding the inputs and the pinned transformers/diffusers outputs. Each output is named
"<output>.<dtype>" (e.g. "last_hidden_state.fp32", "sample.bf16"); the model is loaded with
from_pretrained at that dtype, as FluxPipeline.from_pretrained(torch_dtype=...) loads its components.
Also OUT/<case>/facts.json records what the C++ side must match (attention implementation, saved keys)."""
import argparse
import json
import os
import pathlib

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # keep ctest logs readable

import torch
from safetensors.torch import save_file

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def jitter_small_parameters(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Default inits leave norm weights at 1 and biases at 0, which would hide a swapped or skipped
    tensor; perturb every 1-D parameter so each one matters."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def save_io(case_dir: pathlib.Path, tensors: dict, facts: dict) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(case_dir / "io.safetensors"))
    (case_dir / "facts.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")


def saved_keys(model_dir: pathlib.Path) -> list:
    from safetensors import safe_open

    keys = []
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            keys.extend(f.keys())
    return sorted(keys)


# ---------------------------------------------------------------- CLIP


def clip_case(out: pathlib.Path, name: str, config_kwargs: dict, input_ids: torch.Tensor, dtypes: list) -> None:
    from transformers import CLIPTextConfig, CLIPTextModel

    case_dir = out / name
    model_dir = case_dir / "model"
    torch.manual_seed(0)
    model = CLIPTextModel(CLIPTextConfig(**config_kwargs)).eval()
    jitter_small_parameters(model, torch.Generator().manual_seed(1))
    model.save_pretrained(str(model_dir))

    tensors = {"input_ids": input_ids}
    facts = {"saved_keys": saved_keys(model_dir)}
    for dtype_name in dtypes:
        loaded = CLIPTextModel.from_pretrained(str(model_dir), dtype=DTYPES[dtype_name]).eval()
        facts[f"attn_implementation.{dtype_name}"] = loaded.config._attn_implementation
        with torch.inference_mode():
            result = loaded(input_ids=input_ids)
        tensors[f"last_hidden_state.{dtype_name}"] = result.last_hidden_state
        tensors[f"pooled_output.{dtype_name}"] = result.pooler_output
    write_text_model_prefixed_copy(model_dir, case_dir / "model_text_model_prefix", input_ids,
                                   tensors["last_hidden_state.fp32"])
    save_io(case_dir, tensors, facts)


def write_text_model_prefixed_copy(model_dir: pathlib.Path, copy_dir: pathlib.Path, input_ids: torch.Tensor,
                                   expected: torch.Tensor) -> None:
    """The same weights under "text_model.*", the layout transformers 4.x saved (FLUX.1-dev's
    text_encoder); transformers 5 renames them on load, and so must we."""
    from safetensors.torch import load_file
    from transformers import CLIPTextModel

    copy_dir.mkdir(parents=True, exist_ok=True)
    (copy_dir / "config.json").write_text((model_dir / "config.json").read_text())
    weights = load_file(str(model_dir / "model.safetensors"))
    save_file({f"text_model.{k}": v for k, v in weights.items()}, str(copy_dir / "model.safetensors"),
              metadata={"format": "pt"})
    with torch.inference_mode():
        again = CLIPTextModel.from_pretrained(str(copy_dir)).eval()(input_ids=input_ids).last_hidden_state
    assert torch.equal(again, expected), "transformers no longer maps text_model.* keys"


def clip_cases(out: pathlib.Path) -> None:
    vocab = 1000
    bos, eos = 998, 999  # CLIP's bos/eos are the two highest ids, as 49406/49407 are
    # FLUX.1-dev's text_encoder config has eos_token_id 2: the legacy rule (argmax of the ids) picks the
    # pooled position. Rows are padded with eos, as FLUX's CLIP tokenizer pads with <|endoftext|>.
    generator = torch.Generator().manual_seed(2)
    rows = []
    for length in (5, 77 - 2, 1, 30):
        body = torch.randint(3, 990, (length,), generator=generator)
        row = torch.cat([torch.tensor([bos]), body, torch.tensor([eos])])[:77]
        rows.append(torch.cat([row, torch.full((77 - row.numel(),), eos)]))
    legacy_ids = torch.stack(rows).to(torch.int64)
    clip_case(
        out,
        "clip_legacy_eos",
        dict(vocab_size=vocab, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
             bos_token_id=0, eos_token_id=2, pad_token_id=1),
        legacy_ids,
        ["fp32", "bf16"],
    )

    # A config with the real eos id (post PR #24773): the first position holding eos is pooled, even when
    # larger ids follow it; padding with a separate pad id; a sequence shorter than the position table.
    eos_id = 500
    rows = []
    for length, pad in ((3, 1), (10, 1), (17, eos_id)):
        body = torch.randint(3, vocab, (length,), generator=generator)
        body[body == eos_id] = 7
        row = torch.cat([torch.tensor([499]), body, torch.tensor([eos_id])])
        rows.append(torch.cat([row, torch.full((20 - row.numel(),), pad)]))
    rows[0][-3] = 950  # a larger id after eos: the legacy rule would pick this position
    eos_ids = torch.stack(rows).to(torch.int64)
    clip_case(
        out,
        "clip_eos_id",
        dict(vocab_size=vocab, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=3,
             max_position_embeddings=32, hidden_act="gelu", layer_norm_eps=1e-6,
             bos_token_id=499, eos_token_id=eos_id, pad_token_id=1),
        eos_ids,
        ["fp32"],
    )


# ---------------------------------------------------------------- T5


def t5_case(out: pathlib.Path, name: str, config_kwargs: dict, input_ids: torch.Tensor, dtypes: list) -> None:
    from transformers import T5Config, T5EncoderModel

    case_dir = out / name
    model_dir = case_dir / "model"
    torch.manual_seed(0)
    model = T5EncoderModel(T5Config(**config_kwargs)).eval()
    jitter_small_parameters(model, torch.Generator().manual_seed(1))
    model.save_pretrained(str(model_dir))

    tensors = {"input_ids": input_ids}
    facts = {"saved_keys": saved_keys(model_dir)}
    for dtype_name in dtypes:
        loaded = T5EncoderModel.from_pretrained(str(model_dir), dtype=DTYPES[dtype_name]).eval()
        facts[f"attn_implementation.{dtype_name}"] = loaded.config._attn_implementation
        facts[f"wo_dtype.{dtype_name}"] = str(loaded.encoder.block[0].layer[-1].DenseReluDense.wo.weight.dtype)
        with torch.inference_mode():
            result = loaded(input_ids=input_ids)
        tensors[f"last_hidden_state.{dtype_name}"] = result.last_hidden_state
    # Bucket tables well past the tested sequence and max_distance, from T5Attention's own function.
    from transformers.models.t5.modeling_t5 import T5Attention

    positions = torch.arange(300)
    tensors["relative_position_buckets.300"] = T5Attention._relative_position_bucket(
        positions[None, :] - positions[:, None], bidirectional=True,
        num_buckets=model.config.relative_attention_num_buckets,
        max_distance=model.config.relative_attention_max_distance)
    save_io(case_dir, tensors, facts)


def t5_cases(out: pathlib.Path) -> None:
    generator = torch.Generator().manual_seed(3)

    def padded_rows(lengths, total, vocab):
        rows = []
        for length in lengths:
            body = torch.randint(2, vocab, (length,), generator=generator)
            row = torch.cat([body, torch.tensor([1])])  # eos 1, then pad 0 as T5's tokenizer pads
            rows.append(torch.cat([row, torch.zeros(total - row.numel(), dtype=row.dtype)]))
        return torch.stack(rows).to(torch.int64)

    # T5 v1.1 style (FLUX's text_encoder_2): gated-gelu (gelu_new), 40 tokens against max_distance 20 so
    # the logarithmic buckets and the clamp to the last bucket are both used.
    t5_case(
        out,
        "t5_gated_gelu",
        dict(vocab_size=120, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
             relative_attention_num_buckets=8, relative_attention_max_distance=20,
             feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.1, tie_word_embeddings=False),
        padded_rows((12, 39, 3), 40, 120),
        ["fp32", "bf16", "fp16"],
    )
    # Original T5 style: relu, heads*d_kv != d_model, default 32 buckets / distance 128.
    t5_case(
        out,
        "t5_relu",
        dict(vocab_size=64, d_model=24, d_kv=10, d_ff=40, num_layers=2, num_heads=3,
             feed_forward_proj="relu", layer_norm_epsilon=1e-5),
        padded_rows((4, 11), 16, 64),
        ["fp32"],
    )
    # Another gated activation, to check the "gated-<act>" parsing.
    t5_case(
        out,
        "t5_gated_silu",
        dict(vocab_size=50, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4,
             relative_attention_num_buckets=16, relative_attention_max_distance=32,
             feed_forward_proj="gated-silu"),
        padded_rows((20, 7), 24, 50),
        ["fp32"],
    )


# ---------------------------------------------------------------- VAE


def vae_case(out: pathlib.Path, name: str, config_kwargs: dict, latents: torch.Tensor, image: torch.Tensor,
             dtypes: list) -> None:
    from diffusers import AutoencoderKL

    case_dir = out / name
    model_dir = case_dir / "model"
    torch.manual_seed(0)
    model = AutoencoderKL(**config_kwargs).eval()
    jitter_small_parameters(model, torch.Generator().manual_seed(1))
    model.save_pretrained(str(model_dir))

    tensors = {"latents": latents, "image": image}
    facts = {"saved_keys": saved_keys(model_dir)}
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        loaded = AutoencoderKL.from_pretrained(str(model_dir), torch_dtype=dtype).eval()
        with torch.inference_mode():
            # What FluxPipeline does before decoding packed-and-unpacked latents.
            scaled = latents.to(dtype) / loaded.config.scaling_factor
            if loaded.config.shift_factor is not None:
                scaled = scaled + loaded.config.shift_factor
            tensors[f"decoder_input.{dtype_name}"] = scaled
            tensors[f"sample.{dtype_name}"] = loaded.decode(scaled, return_dict=False)[0]
            posterior = loaded.encode(image.to(dtype)).latent_dist
            tensors[f"latent_mean.{dtype_name}"] = posterior.mean
            tensors[f"latent_logvar.{dtype_name}"] = posterior.logvar
    save_io(case_dir, tensors, facts)


def vae_cases(out: pathlib.Path) -> None:
    generator = torch.Generator().manual_seed(4)
    # FLUX-like: 16 latent channels, no quant convs, mid-block attention, shift factor, 8x upsampling,
    # a non-square latent.
    vae_case(
        out,
        "vae_flux_like",
        dict(in_channels=3, out_channels=3,
             down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
             block_out_channels=[8, 16, 16, 16], layers_per_block=1, act_fn="silu", latent_channels=16,
             norm_num_groups=4, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
             use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True),
        torch.randn(2, 16, 3, 5, generator=generator),
        torch.rand(1, 3, 24, 40, generator=generator) * 2 - 1,
        ["fp32", "bf16"],
    )
    # SD-style: quant convs, no shift factor, two resnets per block (three in the decoder), an odd image
    # size for the encoder's asymmetric downsampling pad, a non-square latent.
    vae_case(
        out,
        "vae_quant_conv",
        dict(in_channels=3, out_channels=3,
             down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
             block_out_channels=[8, 16], layers_per_block=2, act_fn="silu", latent_channels=4,
             norm_num_groups=8, sample_size=32, scaling_factor=0.18215, shift_factor=None,
             use_quant_conv=True, use_post_quant_conv=True, mid_block_add_attention=True),
        torch.randn(1, 4, 5, 3, generator=generator),
        torch.rand(2, 3, 13, 10, generator=generator) * 2 - 1,
        ["fp32"],
    )
    # No mid-block attention, wide channels so the attention-free mid block still has 2 groups per norm.
    vae_case(
        out,
        "vae_no_mid_attention",
        dict(in_channels=3, out_channels=3,
             down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
             block_out_channels=[8, 12], layers_per_block=1, act_fn="silu", latent_channels=4,
             norm_num_groups=4, sample_size=32, scaling_factor=0.5, shift_factor=0.25,
             use_quant_conv=False, use_post_quant_conv=True, mid_block_add_attention=False),
        torch.randn(1, 4, 4, 2, generator=generator),
        torch.rand(1, 3, 8, 12, generator=generator) * 2 - 1,
        ["fp32"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    clip_cases(out)
    t5_cases(out)
    vae_cases(out)


if __name__ == "__main__":
    main()
