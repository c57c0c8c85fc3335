#!/usr/bin/env python3
"""GPU benchmark: one FLUX.1-dev transformer step, diffpipe vs diffusers eager and torch.compile.

Runs on the GPU machine (bench/gpu.sh calls it). All three load the same full-size random-weight folder
written by `diffpipe make-random`, see the same input shapes, and are timed in the same run with device
synchronisation. Prints a table and writes JSON. Timings never pass or fail anything."""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import torch

MATMUL_TFLOPS_PER_BLOCK_1024 = 1.30  # per FLUX block at 4608 tokens (shared/GPU.md), scales with tokens


def step_tflop(batch: int, size: int, text_len: int = 512) -> float:
    tokens = (size // 16) ** 2 + text_len
    # Linear layers dominate: cost grows with tokens; attention adds a quadratic term that is small here.
    return 57 * MATMUL_TFLOPS_PER_BLOCK_1024 * batch * tokens / 4608


def run_diffpipe(binary: str, model: str, batch: int, size: int, repeat: int, graph: bool, fused: bool = True) -> dict:
    cmd = [binary, "forward", "--model", model, "--device", "cuda", "--dtype", "bf16", "--height", str(size),
           "--width", str(size), "--text-len", "512", "--batch", str(batch), "--repeat", str(repeat), "--warmup", "2"]
    if graph:
        cmd.append("--cuda-graph")
    env = dict(os.environ, DIFFPIPE_FUSED_KERNELS="1" if fused else "0")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return {"error": (result.stdout + result.stderr)[-2000:]}
    runs = [float(m) for m in re.findall(r"^run \d+/\d+: ([0-9.]+) ms", result.stderr, re.M)]
    peak = re.search(r"peak during forwards ([0-9.]+) GB", result.stdout)
    loaded = re.search(r"after load ([0-9.]+) GB", result.stdout)
    return {"ms": statistics.median(runs), "peak_gb": float(peak.group(1)), "weights_gb": float(loaded.group(1))}


def run_diffusers(model_dir: str, batch: int, size: int, repeat: int, compiled: bool, model_cache: dict) -> dict:
    from diffusers import FluxTransformer2DModel

    key = "compiled" if compiled else "eager"
    if "model" not in model_cache:
        model_cache["model"] = FluxTransformer2DModel.from_pretrained(
            model_dir, subfolder="transformer", torch_dtype=torch.bfloat16).to("cuda").eval()
    model = model_cache["model"]
    if compiled and "compiled" not in model_cache:
        model_cache["compiled"] = torch.compile(model)
    fn = model_cache.get(key, model)
    side = size // 16
    ids = torch.zeros(side, side, 3, device="cuda")
    ids[..., 1] = torch.arange(side, device="cuda")[:, None]
    ids[..., 2] = torch.arange(side, device="cuda")[None, :]
    args = dict(
        hidden_states=torch.randn(batch, side * side, 64, device="cuda", dtype=torch.bfloat16),
        encoder_hidden_states=torch.randn(batch, 512, 4096, device="cuda", dtype=torch.bfloat16),
        pooled_projections=torch.randn(batch, 768, device="cuda", dtype=torch.bfloat16),
        timestep=torch.full((batch,), 0.75, device="cuda", dtype=torch.bfloat16),
        img_ids=ids.reshape(-1, 3), txt_ids=torch.zeros(512, 3, device="cuda"),
        guidance=torch.full((batch,), 3.5, device="cuda"), return_dict=False)
    torch.cuda.reset_peak_memory_stats()
    times = []
    with torch.inference_mode():
        for i in range(repeat + (3 if compiled else 2)):
            torch.cuda.synchronize()
            started = time.perf_counter()
            fn(**args)
            torch.cuda.synchronize()
            if i >= (3 if compiled else 2):
                times.append((time.perf_counter() - started) * 1000)
    return {"ms": statistics.median(times), "peak_gb": torch.cuda.max_memory_allocated() / 1e9}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--diffpipe", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", required=True)
    parser.add_argument("--only", choices=["diffpipe", "diffusers"], help="run one side (the lease limits one call)")
    args = parser.parse_args()
    cases = [(1, 1024), (4, 1024), (1, 512)]
    results = []
    cache: dict = {}
    for batch, size in cases:
        row = {"batch": batch, "size": size, "tflop": step_tflop(batch, size)}
        if args.only != "diffusers":
            row["diffpipe"] = run_diffpipe(args.diffpipe, args.model, batch, size, args.repeat, graph=False)
            row["diffpipe_graph"] = run_diffpipe(args.diffpipe, args.model, batch, size, args.repeat, graph=True)
            if (batch, size) == cases[0]:  # A/B of the fused kernels on the target shape
                row["diffpipe_unfused"] = run_diffpipe(args.diffpipe, args.model, batch, size, args.repeat,
                                                       graph=False, fused=False)
            print(json.dumps(row), flush=True)
        results.append(row)
    if args.only != "diffpipe":
        for row in results:
            row["diffusers_eager"] = run_diffusers(args.model, row["batch"], row["size"], args.repeat, False, cache)
            print(json.dumps(row), flush=True)
        for row in results[:1]:  # compiling every shape would not fit one call; 1024x1024 batch 1 is the target
            try:
                row["diffusers_compiled"] = run_diffusers(args.model, row["batch"], row["size"], args.repeat, True, cache)
            except Exception as e:  # report, keep the other figures
                row["diffusers_compiled"] = {"error": str(e)[-500:]}
            print(json.dumps(row), flush=True)
    pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    roof_tflops = 800.0
    print(f"\n{'case':<16}{'variant':<20}{'ms/step':>10}{'% of roof':>11}{'peak GB':>9}")
    for row in results:
        floor_ms = row["tflop"] / roof_tflops * 1000
        for variant in ("diffpipe_unfused", "diffpipe", "diffpipe_graph", "diffusers_eager", "diffusers_compiled"):
            r = row.get(variant)
            if not r:
                continue
            if "error" in r:
                print(f"b{row['batch']} {row['size']}x{row['size']:<8}{variant:<20} error: {r['error'][-200:]}")
                continue
            print(f"b{row['batch']} {row['size']}x{row['size']:<8}{variant:<20}{r['ms']:>10.1f}"
                  f"{100 * floor_ms / r['ms']:>10.0f}%{r['peak_gb']:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
