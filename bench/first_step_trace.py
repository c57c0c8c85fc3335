#!/usr/bin/env python3
"""Where a run's first denoising step spends the time its later steps do not: reads one `diffpipe generate` as
an Nsight Systems export (`nsys profile -t cuda,nvtx ... --export sqlite`) or as LibTorch's profiler recorded it
(`diffpipe generate --torch-profile FILE.json`, for machines without Nsight Systems), and compares the loop's
first steps.

A step's window runs from the start of its compute range ("blocks [a,b) mb M step S", an NVTX range and a
profiler annotation that runtime/compute_clock.cpp opens) to the start of the next step's; the first step's
starts with the "denoising" NVTX range, or with the profile (which starts just before the loop), so that it
holds what the loop does before its first forward. For each window: the host's time, the kernels launched on
the GPU in it (count, summed time, busy and idle time of the busiest stream), the copies, and the CUDA API calls
made on the host; then what step 1 has that step 2 has not, kernel by kernel name and API call by name; then the
last window's kernel time by family (GEMM, attention, diffpipe's fused kernels, ...), which is the in-loop
breakdown of a steady step that Nsight Compute's replays of single kernels at idle clocks cannot give.

    python3 bench/first_step_trace.py run.sqlite|profile.json [--steps 4] [--json out.json]
"""
import argparse
import collections
import json
import pathlib
import re
import sqlite3
import sys

STEP_RANGE = re.compile(r"^blocks \[\d+,\d+\) mb (\d+) step (\d+)$")
# Kernel families by name, first match wins: attention before GEMM, since cuDNN's attention kernels carry sm90 too.
FAMILIES = [
    ("attention", re.compile(r"sdpa|flash|fmha|attention|attn", re.I)),
    ("GEMM", re.compile(r"nvjet|gemm|cutlass|xmma|cublas|_scaled_mm", re.I)),
    ("FP8 quantiser (diffpipe)", re.compile(r"quantize_rows")),
    ("fused (diffpipe)", re.compile(r"qk_norm_rope|layer_norm_modulate|add_gated|gelu_tanh")),
    ("copies, cat", re.compile(r"copy|CatArray|cat_", re.I)),
    ("reductions, norms", re.compile(r"reduce|norm", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def kernel_family(name):
    return next((family for family, pattern in FAMILIES if pattern.search(name)), "other")


class Trace:
    """What the comparison needs from either file, times in nanoseconds: NVTX or annotation ranges (text, start,
    end), kernels (name, start, end, stream), copies and memsets (start, end), host API calls (name, start, end),
    and where the recording began."""

    def __init__(self):
        self.ranges, self.kernels, self.copies, self.calls = [], [], [], []
        self.began = None


def read_nsys_sqlite(path):
    db = sqlite3.connect(path)
    have = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in have or "NVTX_EVENTS" not in have:
        sys.exit(f"first_step_trace: {path} has no kernel or NVTX table (traced with -t cuda,nvtx?)")
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    trace = Trace()
    rows = db.execute("SELECT text, textId, start, end FROM NVTX_EVENTS WHERE end IS NOT NULL ORDER BY start")
    trace.ranges = [(text if text is not None else names.get(text_id, ""), start, end)
                    for text, text_id, start, end in rows]
    trace.kernels = [(names.get(n, str(n)), s, e, stream) for n, s, e, stream in
                     db.execute("SELECT shortName, start, end, streamId FROM CUPTI_ACTIVITY_KIND_KERNEL")]
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in have:
            trace.copies += db.execute(f"SELECT start, end FROM {table}").fetchall()
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table in have:
            trace.calls += [(names.get(n, str(n)), s, e) for n, s, e in
                            db.execute(f"SELECT nameId, start, end FROM {table}")]
    loop = [start for text, start, _ in trace.ranges if text == "denoising"]
    trace.began = loop[0] if loop else None
    return trace


def read_kineto_json(path):
    """A Chrome trace from LibTorch's profiler (`diffpipe generate --torch-profile`): microseconds, categories
    kernel, gpu_memcpy / gpu_memset, cuda_runtime / cuda_driver and user_annotation (the compute spans)."""
    try:
        events = json.loads(pathlib.Path(path).read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"first_step_trace: {path} is not a Chrome trace with traceEvents ({e})")
    trace = Trace()
    timed = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e]
    for e in timed:
        start = int(float(e["ts"]) * 1000)
        end = start + int(float(e.get("dur", 0)) * 1000)
        kind = e.get("cat", "")
        if kind == "kernel":
            trace.kernels.append((e.get("name", ""), start, end, (e.get("args") or {}).get("stream", 0)))
        elif kind in ("gpu_memcpy", "gpu_memset"):
            trace.copies.append((start, end))
        elif kind in ("cuda_runtime", "cuda_driver"):
            trace.calls.append((e.get("name", ""), start, end))
        elif kind == "user_annotation":
            trace.ranges.append((e.get("name", ""), start, end))
    trace.ranges.sort(key=lambda r: r[1])
    # The profile starts just before the loop: its first event opens step 1's window.
    trace.began = min((int(float(e["ts"]) * 1000) for e in timed), default=None)
    return trace


def step_windows(trace, steps):
    """[(label, start, end)] for steps 1..steps (ns); exits with a reason if the ranges are absent."""
    starts = {}
    for text, start, _ in trace.ranges:
        match = STEP_RANGE.match(text)
        if match and match.group(1) == "0":
            starts.setdefault(int(match.group(2)), start)
    if trace.began is None or 1 not in starts:
        sys.exit("first_step_trace: no 'denoising' range or no step ranges in the file (a build without NVTX?)")
    bounds = [trace.began] + [starts[s] for s in range(2, steps + 2) if s in starts]
    return [(f"step {i + 1}", bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def busy_time(intervals):
    """Time covered by the union of (start, end) intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def window_figures(trace, start, end):
    kernels = [k for k in trace.kernels if start <= k[1] < end]
    by_stream = collections.Counter(str(stream) for *_, stream in kernels)
    main_stream = by_stream.most_common(1)[0][0] if kernels else None
    on_main = [(s, e) for _, s, e, stream in kernels if str(stream) == main_stream]
    per_kernel = collections.defaultdict(lambda: [0, 0])
    for name, s, e, _ in kernels:
        per_kernel[name][0] += 1
        per_kernel[name][1] += e - s
    copies = [c for c in trace.copies if start <= c[0] < end]
    per_call = collections.defaultdict(lambda: [0, 0])
    for name, s, e in trace.calls:
        if start <= s < end:
            per_call[name][0] += 1
            per_call[name][1] += e - s
    first = min((s for s, _ in on_main), default=start)
    last = max((e for _, e in on_main), default=start)
    return {
        "host_ms": (end - start) / 1e6,
        "kernels": len(kernels),
        "streams": dict(by_stream),
        "kernel_ms": sum(e - s for _, s, e, _ in kernels) / 1e6,
        "main_stream_busy_ms": busy_time(on_main) / 1e6,
        "main_stream_span_ms": (last - first) / 1e6,
        "main_stream_idle_ms": (last - first - busy_time(on_main)) / 1e6,
        "before_first_kernel_ms": (first - start) / 1e6,
        "copies": len(copies),
        "copy_ms": sum(e - s for s, e in copies) / 1e6,
        "per_kernel": {k: {"count": c, "ms": t / 1e6} for k, (c, t) in per_kernel.items()},
        "per_call": {k: {"count": c, "ms": t / 1e6} for k, (c, t) in per_call.items()},
    }


def families(window):
    """{family: {"count", "ms"}} of a window's per-kernel figures, largest first."""
    totals = collections.defaultdict(lambda: {"count": 0, "ms": 0.0})
    for name, figures in window["per_kernel"].items():
        family = totals[kernel_family(name)]
        family["count"] += figures["count"]
        family["ms"] += figures["ms"]
    return dict(sorted(totals.items(), key=lambda item: -item[1]["ms"]))


def differences(first, second, key, top):
    names = set(first[key]) | set(second[key])
    rows = []
    for name in names:
        a = first[key].get(name, {"count": 0, "ms": 0.0})
        b = second[key].get(name, {"count": 0, "ms": 0.0})
        rows.append((a["ms"] - b["ms"], name, a, b))
    rows.sort(key=lambda r: -abs(r[0]))
    return rows[:top]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="an nsys SQLite export, or a --torch-profile JSON (by its .json suffix)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    trace = read_kineto_json(args.trace) if args.trace.endswith(".json") else read_nsys_sqlite(args.trace)
    windows = step_windows(trace, args.steps)
    figures = {label: window_figures(trace, start, end) for label, start, end in windows}
    print(f"{'window':8} {'host ms':>8} {'kernels':>8} {'kernel ms':>10} {'busy ms':>8} {'idle ms':>8} "
          f"{'lead ms':>8} {'copies':>7} streams")
    for label, f in figures.items():
        print(f"{label:8} {f['host_ms']:8.2f} {f['kernels']:8d} {f['kernel_ms']:10.2f} {f['main_stream_busy_ms']:8.2f} "
              f"{f['main_stream_idle_ms']:8.2f} {f['before_first_kernel_ms']:8.2f} {f['copies']:7d} {f['streams']}")
    if len(figures) >= 2:
        first, second = figures["step 1"], figures["step 2"]
        print("\nkernels, step 1 against step 2 (largest differences):")
        for diff, name, a, b in differences(first, second, "per_kernel", args.top):
            print(f"  {diff:+8.3f} ms  {a['count']:4d} vs {b['count']:4d} launches  {name[:110]}")
        print("\nCUDA API calls on the host, step 1 against step 2 (largest differences):")
        for diff, name, a, b in differences(first, second, "per_call", args.top):
            print(f"  {diff:+8.3f} ms  {a['count']:5d} vs {b['count']:5d} calls  {name[:110]}")
    if len(figures) >= 2:
        label = list(figures)[-1]
        last = figures[label]
        last["families"] = families(last)
        print(f"\nkernel time by family, {label} (a steady step; its window {last['host_ms']:.2f} ms, the main "
              f"stream busy {last['main_stream_busy_ms']:.2f} ms, idle {last['main_stream_idle_ms']:.2f} ms):")
        for family, f in last["families"].items():
            share = f["ms"] / last["kernel_ms"] if last["kernel_ms"] else 0.0
            print(f"  {family:26} {f['ms']:8.2f} ms  {share:6.1%}  {f['count']:5d} launches")
        top = sorted(last["per_kernel"].items(), key=lambda item: -item[1]["ms"])[:args.top]
        print(f"\nlongest kernels of {label}:")
        for name, f in top:
            print(f"  {f['ms']:8.3f} ms  {f['count']:4d} launches  {kernel_family(name):12.12}  {name[:90]}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
