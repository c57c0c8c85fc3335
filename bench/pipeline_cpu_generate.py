#!/usr/bin/env python3
"""CPU benchmark: a whole tiny-pipeline generate, diffpipe vs diffusers' FluxPipeline, same folder, prompts,
seed and thread count. Prints wall time and peak resident memory of each and their ratios. Each side runs
in its own process so that its peak RSS is its own. Timings never pass or fail anything."""
import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

DIFFUSERS_RUN = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from diffusers import FluxPipeline
args = json.loads(sys.argv[3])
started = time.perf_counter()
pipe = FluxPipeline.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
with torch.inference_mode():
    pipe(prompt=args["prompts"], num_images_per_prompt=args["n"], height=args["size"], width=args["size"],
         num_inference_steps=args["steps"], guidance_scale=3.5, max_sequence_length=args["seq"],
         generator=torch.Generator("cpu").manual_seed(args["seed"]), output_type="pil")
print(json.dumps({"seconds": time.perf_counter() - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def child_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--diffpipe", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    call = {"prompts": ["a cat sipping a margarita in a pool", "a lighthouse at dusk"], "n": 2, "size": args.size,
            "steps": args.steps, "seq": 64, "seed": 42}
    with tempfile.TemporaryDirectory(prefix="diffpipe-bench-") as tmp:
        model = pathlib.Path(tmp) / "tiny"
        subprocess.run([args.diffpipe, "make-tiny", "--out", str(model)], check=True, capture_output=True)
        command = [args.diffpipe, "generate", "--model", str(model), "--dtype", "fp32", "--height", str(args.size),
                   "--width", str(args.size), "--steps", str(args.steps), "--seed", "42",
                   "--num-images-per-prompt", "2", "--max-sequence-length", "64", "--out", f"{tmp}/img.png"]
        for p in call["prompts"]:
            command += ["--prompt", p]
        env = {"OMP_NUM_THREADS": str(args.threads), "PATH": "/usr/bin:/bin"}
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env)
        ours = {"seconds": time.perf_counter() - started, "peak_rss_mb": child_peak_mb()}
        result = subprocess.run([sys.executable, "-c", DIFFUSERS_RUN, str(model), str(args.threads), json.dumps(call)],
                                check=True, capture_output=True, text=True)
        theirs = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"whole tiny-pipeline generate, CPU fp32, {args.threads} threads, 2 prompts x 2 images, "
          f"{args.size}x{args.size}, {args.steps} steps (load + encode + denoise + decode)")
    print(f"  diffpipe   {ours['seconds']:8.2f} s   peak RSS {ours['peak_rss_mb']:8.1f} MB")
    print(f"  diffusers  {theirs['seconds']:8.2f} s   peak RSS {theirs['peak_rss_mb']:8.1f} MB")
    print(f"  ratio diffpipe/diffusers: time {ours['seconds'] / theirs['seconds']:.3f}, "
          f"peak memory {ours['peak_rss_mb'] / theirs['peak_rss_mb']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
