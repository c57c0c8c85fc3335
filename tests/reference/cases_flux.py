#!/usr/bin/env python3
"""Oracle for the FLUX transformer: tiny random FluxTransformer2DModel folders and diffusers' outputs.

For each case: OUT/<case>/transformer/ (save_pretrained, safetensors), OUT/<case>/io.safetensors with the
inputs and the fp32 output, plus a bf16 output from the same weights cast by diffusers, and "fp8" outputs: the
fp32 and the bf16 model with the blocks' projections replaced by the definition of diffpipe's --fp8-gemms (e4m3
with a scale per weight row and per token, dequantised and multiplied in fp32, rounded to the model's dtype)."""
import argparse
import copy
import json
import pathlib

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import save_file

CASES = {
    # guidance on, non-square token grid (4 x 6), odd text length
    "guidance_nonsquare": dict(
        config=dict(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3, attention_head_dim=16,
                    num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=24, guidance_embeds=True,
                    axes_dims_rope=[4, 6, 6]),
        batch=1, grid=(4, 6), text_len=7, guidance=3.5),
    # no guidance (schnell-like), batch 2, out_channels differs, 3 x 5 grid
    "no_guidance_batch2": dict(
        config=dict(patch_size=1, in_channels=12, out_channels=6, num_layers=1, num_single_layers=2,
                    attention_head_dim=8, num_attention_heads=3, joint_attention_dim=20, pooled_projection_dim=16,
                    guidance_embeds=False, axes_dims_rope=[2, 2, 4]),
        batch=2, grid=(3, 5), text_len=5, guidance=None),
    # FLUX.1-dev layout in miniature: 64 channels, rope split 16/56/56 scaled down, more blocks for split tests
    "dev_like": dict(
        config=dict(patch_size=1, in_channels=64, num_layers=3, num_single_layers=4, attention_head_dim=32,
                    num_attention_heads=2, joint_attention_dim=48, pooled_projection_dim=32, guidance_embeds=True,
                    axes_dims_rope=[4, 14, 14]),
        batch=2, grid=(6, 4), text_len=11, guidance=4.0),
}


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row rounded to e4m3 after scaling its largest magnitude to 448, and scaled back, in fp32."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / torch.tensor(448.0)
    return (x.float() / scale).to(torch.float8_e4m3fn).float() * scale


class Fp8Linear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight = fp8_rows(linear.weight.detach())
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x):
        return torch.nn.functional.linear(fp8_rows(x), self.weight, self.bias).to(x.dtype)


def with_fp8_projections(model: FluxTransformer2DModel) -> FluxTransformer2DModel:
    """A copy whose block Linears (not the modulation rows, named norm*) are Fp8Linear where both sizes are
    multiples of 16, the FP8 tensor cores' granularity; the others stay as they are, as in diffpipe."""
    model = copy.deepcopy(model)
    for blocks in (model.transformer_blocks, model.single_transformer_blocks):
        for block in blocks:
            for name, module in list(block.named_modules()):
                if not isinstance(module, torch.nn.Linear) or "norm" in name:
                    continue
                if module.in_features % 16 or module.out_features % 16:
                    continue
                parent = block.get_submodule(name.rsplit(".", 1)[0]) if "." in name else block
                setattr(parent, name.rsplit(".", 1)[-1], Fp8Linear(module))
    return model


def image_ids(rows: int, cols: int) -> torch.Tensor:
    ids = torch.zeros(rows, cols, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(cols)[None, :]
    return ids.reshape(rows * cols, 3)


def make_case(out: pathlib.Path, name: str, spec: dict, seed: int) -> None:
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(**spec["config"]).eval()
    # Random init leaves some projections at zero (AdaLN, proj_out); perturb every parameter so that each
    # path through the model matters in the comparison.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    case_dir = out / name
    model.save_pretrained(case_dir / "transformer", safe_serialization=True)

    cfg = model.config
    rows, cols = spec["grid"]
    b, n_img, n_txt = spec["batch"], rows * cols, spec["text_len"]
    gen = torch.Generator().manual_seed(seed + 1)
    inputs = {
        "hidden_states": torch.randn(b, n_img, cfg.in_channels, generator=gen),
        "encoder_hidden_states": torch.randn(b, n_txt, cfg.joint_attention_dim, generator=gen),
        "pooled_projections": torch.randn(b, cfg.pooled_projection_dim, generator=gen),
        "timestep": torch.rand(b, generator=gen),
        "img_ids": image_ids(rows, cols),
        "txt_ids": torch.zeros(n_txt, 3),
    }
    if spec["guidance"] is not None:
        inputs["guidance"] = torch.full((b,), spec["guidance"], dtype=torch.float32)

    def run(dtype: torch.dtype, fp8: bool = False) -> torch.Tensor:
        m = with_fp8_projections(model.to(dtype)) if fp8 else model.to(dtype)
        with torch.inference_mode():
            args = {k: (v.to(dtype) if k not in ("img_ids", "txt_ids", "guidance", "timestep") else v)
                    for k, v in inputs.items()}
            return m(**args, return_dict=False)[0].float()

    tensors = {f"input.{k}": v.contiguous() for k, v in inputs.items()}
    tensors["output.fp32"] = run(torch.float32).contiguous()
    tensors["output.fp8_fp32"] = run(torch.float32, fp8=True).contiguous()  # before the cast below, in place
    tensors["output.bf16"] = run(torch.bfloat16).contiguous()
    tensors["output.fp8"] = run(torch.bfloat16, fp8=True).contiguous()
    save_file(tensors, str(case_dir / "io.safetensors"))
    (case_dir / "case.json").write_text(json.dumps({"name": name, **{k: v for k, v in spec.items() if k != "config"}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    for i, (name, spec) in enumerate(CASES.items()):
        make_case(out, name, spec, seed=1000 + i)
    (out / "cases.json").write_text(json.dumps(sorted(CASES)))


if __name__ == "__main__":
    main()
