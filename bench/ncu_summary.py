#!/usr/bin/env python3
"""Sums an Nsight Compute CSV of per-kernel durations by kernel family, for the profile tables in RESULTS.md.

    ncu --clock-control none --csv --metrics gpu__time_duration.sum <command> > kernels.csv
    python3 bench/ncu_summary.py kernels.csv [--top 20] [--json out.json]

Rows other than the gpu__time_duration.sum metric, and ncu's own log lines, are skipped."""
import argparse
import collections
import csv
import json
import re
import sys

UNIT_TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}

# First match wins: order from the most specific pattern to the most general.
FAMILIES = [
    # cuDNN's SDPA kernels also carry "sm90_" in their names, so attention is matched before the GEMMs.
    ("attention (flash / cuDNN SDPA)", re.compile(r"flash|fmha|sdpa|attention", re.I)),
    ("GEMM (cuBLAS / cuBLASLt)", re.compile(r"nvjet|gemm|cutlass|xmma|sm90_", re.I)),
    ("diffpipe FP8 quantiser (--fp8-gemms)", re.compile(r"quantize_rows_kernel", re.I)),
    ("diffpipe fused kernels", re.compile(r"qk_norm_rope|layer_norm_modulate|add_gated|gelu_tanh_kernel", re.I)),
    ("ATen copies / cat", re.compile(r"copy|cat_|CatArray", re.I)),
    ("ATen reductions / norms", re.compile(r"reduce|norm|softmax", re.I)),
    ("ATen elementwise", re.compile(r"elementwise|unrolled|vectorized", re.I)),
]


def family_of(name: str) -> str:
    for family, pattern in FAMILIES:
        if pattern.search(name):
            return family
    return "other"


def read_kernels(path: str) -> list:
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu prefixes its own messages with ==PROF==
    kernels = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = UNIT_TO_MS.get(row.get("Metric Unit", ""), None)
        if scale is None:
            raise SystemExit(f"unknown duration unit {row.get('Metric Unit')!r} in {path}")
        value = float(row["Metric Value"].replace(",", ""))
        kernels.append((row["Kernel Name"], value * scale))
    return kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=15, help="also list the N kernels with the most total time")
    parser.add_argument("--json", help="write the summary here too")
    args = parser.parse_args()
    kernels = read_kernels(args.csv)
    if not kernels:
        print(f"no gpu__time_duration.sum rows in {args.csv}", file=sys.stderr)
        return 1
    total = sum(ms for _, ms in kernels)
    by_family = collections.defaultdict(lambda: [0.0, 0])
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for name, ms in kernels:
        for table, key in ((by_family, family_of(name)), (by_name, name[:110])):
            table[key][0] += ms
            table[key][1] += 1
    print(f"{len(kernels)} kernels, {total:.1f} ms of kernel time\n")
    print("| family | ms | share | launches |\n|---|---|---|---|")
    for family, (ms, count) in sorted(by_family.items(), key=lambda kv: -kv[1][0]):
        print(f"| {family} | {ms:.1f} | {100 * ms / total:.0f}% | {count} |")
    print(f"\ntop {args.top} kernels by total time:")
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[: args.top]
    for name, (ms, count) in top:
        print(f"  {ms:8.2f} ms  {count:5d} x {1000 * ms / count:8.1f} us  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"total_ms": total, "kernels": len(kernels),
                       "families": {k: {"ms": v[0], "launches": v[1]} for k, v in by_family.items()},
                       "top": [{"name": k, "ms": v[0], "launches": v[1]} for k, v in top]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
