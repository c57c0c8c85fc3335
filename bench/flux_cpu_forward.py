#!/usr/bin/env python3
"""CPU benchmark: FLUX transformer forward, diffpipe vs diffusers on the same weights, inputs and threads.

Builds a small-but-not-tiny random FluxTransformer2DModel with diffusers' save_pretrained, writes one set
of inputs, then times `diffpipe forward` and diffusers' forward on them in the same run and prints the
ratio (and the largest output difference, as a sanity check). Timings never pass or fail anything."""
import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from diffusers import FluxTransformer2DModel
from safetensors.torch import load_file, save_file

CONFIG = dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=64,
              num_attention_heads=12, joint_attention_dim=512, pooled_projection_dim=256, guidance_embeds=True,
              axes_dims_rope=[8, 28, 28])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--diffpipe", required=True, help="path to the diffpipe binary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--size", type=int, default=512, help="image height and width in pixels")
    parser.add_argument("--text-len", type=int, default=128)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16

    with tempfile.TemporaryDirectory(prefix="diffpipe-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        torch.manual_seed(0)
        model = FluxTransformer2DModel(**CONFIG).eval()
        model.save_pretrained(tmp / "transformer")
        side = args.size // 16
        ids = torch.zeros(side, side, 3)
        ids[..., 1] = torch.arange(side)[:, None]
        ids[..., 2] = torch.arange(side)[None, :]
        inputs = {
            "hidden_states": torch.randn(1, side * side, CONFIG["in_channels"]),
            "encoder_hidden_states": torch.randn(1, args.text_len, CONFIG["joint_attention_dim"]),
            "pooled_projections": torch.randn(1, CONFIG["pooled_projection_dim"]),
            "timestep": torch.tensor([0.75]),
            "img_ids": ids.reshape(-1, 3),
            "txt_ids": torch.zeros(args.text_len, 3),
            "guidance": torch.tensor([3.5]),
        }
        save_file({f"input.{k}": v.contiguous() for k, v in inputs.items()}, str(tmp / "inputs.safetensors"))

        command = [args.diffpipe, "forward", "--model", str(tmp), "--device", "cpu", "--inputs", str(tmp / "inputs.safetensors"),
                   "--threads", str(args.threads), "--repeat", str(args.repeat), "--warmup", "1",
                   "--dtype", args.dtype, "--save", str(tmp / "out.safetensors")]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            print(result.stdout, result.stderr, file=sys.stderr)
            return 1
        runs = [float(m) for m in re.findall(r"^run \d+/\d+: ([0-9.]+) ms", result.stderr, re.M)]
        ours = statistics.median(runs)
        our_out = load_file(str(tmp / "out.safetensors"))["output"].float()

        model = model.to(dtype)
        call = {k: (v.to(dtype) if k in ("hidden_states", "encoder_hidden_states", "pooled_projections") else v)
                for k, v in inputs.items()}
        times = []
        with torch.inference_mode():
            for i in range(args.repeat + 1):
                started = time.perf_counter()
                ref = model(**call, return_dict=False)[0]
                if i > 0:
                    times.append((time.perf_counter() - started) * 1000)
        theirs = statistics.median(times)
        diff = (our_out - ref.float()).abs().max().item() / ref.float().abs().max().item()

    tokens = (args.size // 16) ** 2
    print(f"FLUX transformer forward, CPU, {args.dtype}, {args.threads} threads, {args.size}x{args.size} "
          f"({tokens} image + {args.text_len} text tokens), hidden {CONFIG['num_attention_heads'] * CONFIG['attention_head_dim']}, "
          f"{CONFIG['num_layers']} double + {CONFIG['num_single_layers']} single blocks, median of {args.repeat}")
    print(f"  diffpipe  {ours:9.1f} ms")
    print(f"  diffusers {theirs:9.1f} ms")
    print(f"  ratio diffpipe/diffusers = {ours / theirs:.3f} (below 1 means diffpipe is faster)")
    print(f"  max relative output difference = {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
