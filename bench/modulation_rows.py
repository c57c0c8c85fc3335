#!/usr/bin/env python3
"""What FLUX.1-dev's modulation rows cost a step, and what computing them once for the whole schedule would cost.

Every block projects silu(temb), one row per image, through its AdaLayerNorm linear (a double block two of
3072 -> 18432, a single block one of 3072 -> 9216; the head's norm_out 3072 -> 6144): 3.2 billion weights, 6.45 GB
of bf16 read for one row each, every step. temb depends on the step only through the timestep, so the rows of
all steps could come from one pass over those weights at the loop's start. This times, with CUDA events in one
process on random bf16 weights (the arithmetic is the same):
  - one step's projections at M = 1 row (as the loop runs them today), median of --repeat;
  - one pass of the same projections at M = steps rows (the schedule at once), for each --steps.
Figures only: nothing passes or fails.

    python3 bench/modulation_rows.py [--steps 28,50] [--repeat 20]
"""
import argparse
import statistics

import torch

DIM, LAYERS, SINGLE_LAYERS = 3072, 19, 38


def projections(device, dtype):
    widths = [6 * DIM, 6 * DIM] * LAYERS + [3 * DIM] * SINGLE_LAYERS + [2 * DIM]
    return [(torch.randn(w, DIM, device=device, dtype=dtype) * 0.02, torch.randn(w, device=device, dtype=dtype))
            for w in widths]


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="28,50")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    weights = projections(device, dtype)
    total_bytes = sum(w.numel() * w.element_size() for w, _ in weights)

    def run(rows):
        act = torch.nn.functional.silu(torch.randn(rows, DIM, device=device, dtype=dtype))
        return lambda: [torch.nn.functional.linear(act, w, b) for w, b in weights]

    with torch.inference_mode():
        for fn in (run(1), run(28)):  # cuBLAS handles, heuristics and kernels loaded before any timing
            timed(fn, 2)
        per_step = timed(run(1), args.repeat)
        print(f"{torch.cuda.get_device_name()}: {len(weights)} modulation projections, "
              f"{total_bytes / 1e9:.2f} GB of bf16 weights")
        print(f"one step, M = 1: {per_step:.3f} ms ({total_bytes / per_step / 1e9:.2f} TB/s)")
        for steps in (int(s) for s in args.steps.split(",")):
            once = timed(run(steps), args.repeat)
            saved = steps * per_step - once
            print(f"the schedule at once, M = {steps}: {once:.3f} ms, against {steps} x {per_step:.3f} = "
                  f"{steps * per_step:.1f} ms a step at a time: {saved:.1f} ms less an image "
                  f"({saved / steps:.3f} ms a step), ratio {once / (steps * per_step):.3f}")


if __name__ == "__main__":
    main()
