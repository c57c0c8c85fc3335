#!/usr/bin/env python3
"""Where FLUX's VAE decode at 1024x1024 spends its time, and what the memory format does to it (GPU machine).

diffusers' AutoencoderKL with FLUX.1-dev's VAE configuration (random weights: the arithmetic is the same), bf16,
eval mode, decoding one 16x128x128 latent: the tensors in NCHW (contiguous, as diffusers and diffpipe run it
today) against channels_last (NHWC, cuDNN's native layout on Hopper), side by side in one process: the median
decode of --repeat after two warm-up ones, the ratio, how far apart the two images are, and for each layout the
kernel time by family from one decode under LibTorch's profiler. Figures only: nothing passes or fails.

    PYTHONPATH=... python3 bench/vae_decode.py [--height 1024 --width 1024] [--repeat 10] [--json out.json]
                                               [--save DIR]
--save writes the random VAE with save_pretrained (bf16), for bench/vae_decode_bench.cpp to decode the same one.
"""
import argparse
import collections
import json
import re
import statistics
import time

import torch
from diffusers import AutoencoderKL

# FLUX.1-dev's vae/config.json, less the fields that do not change the decoder's arithmetic.
FLUX_VAE = dict(in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
                layers_per_block=2, norm_num_groups=32, act_fn="silu", sample_size=1024, use_quant_conv=False,
                use_post_quant_conv=False, scaling_factor=0.3611, shift_factor=0.1159,
                down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)

FAMILIES = [
    ("convolution", re.compile(r"conv|implicit_gemm|fprop|xmma|nvjet|gemm|wgrad|dgrad", re.I)),
    ("layout transposes", re.compile(r"nchwToNhwc|nhwcToNchw|transpose", re.I)),
    ("group norm", re.compile(r"GroupNorm|Moments|group_norm|ComputeFused|RowwiseMoments", re.I)),
    ("attention", re.compile(r"fmha|flash|attention|sdpa", re.I)),
    ("upsample", re.compile(r"upsample", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def family(name):
    return next((f for f, pattern in FAMILIES if pattern.search(name)), "other")


def decode_ms(vae, latents, repeat):
    times = []
    with torch.inference_mode():
        for i in range(repeat + 2):
            torch.cuda.synchronize()
            started = time.perf_counter()
            image = vae.decode(latents).sample
            torch.cuda.synchronize()
            if i >= 2:
                times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), image


def kernel_families(vae, latents):
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        vae.decode(latents)
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[family(event.name)]
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us() / 1000
    return {name: {"launches": n, "ms": ms} for name, (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json")
    parser.add_argument("--save", help="write the random VAE here (save_pretrained, bf16)")
    args = parser.parse_args()
    torch.manual_seed(0)
    vae = AutoencoderKL(**FLUX_VAE).to("cuda", torch.bfloat16).eval()
    if args.save:
        vae.save_pretrained(args.save)
    latents = torch.randn(1, 16, args.height // 8, args.width // 8, device="cuda", dtype=torch.bfloat16)
    results, images = {}, {}
    for layout, fmt in (("NCHW", torch.contiguous_format), ("channels_last", torch.channels_last)):
        vae = vae.to(memory_format=fmt)
        ms, images[layout] = decode_ms(vae, latents.contiguous(memory_format=fmt), args.repeat)
        results[layout] = {"median_ms": ms, "families": kernel_families(vae, latents.contiguous(memory_format=fmt))}
    nchw, nhwc = images["NCHW"].float(), images["channels_last"].float()
    difference = (nchw - nhwc).abs().max().item()
    print(f"VAE decode {args.width}x{args.height}, bf16, median of {args.repeat} ({torch.cuda.get_device_name()}):")
    base = results["NCHW"]["median_ms"]
    for layout, r in results.items():
        print(f"  {layout:14} {r['median_ms']:8.2f} ms  {r['median_ms'] / base:5.3f}x NCHW")
    print(f"  largest difference between the two images: {difference:.4f} (pixel values in [-1, 1])")
    for layout, r in results.items():
        print(f"kernel time by family, {layout}:")
        for name, f in r["families"].items():
            print(f"  {name:18} {f['ms']:8.2f} ms  {f['launches']:5d} launches")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"results": results, "max_difference": difference}, out, indent=1)


if __name__ == "__main__":
    main()
