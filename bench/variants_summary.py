"""The diffpipe runs of `bench/gpu_pipeline.sh`'s VARIANTS side by side, each as a ratio to the baseline runs'
mean (the variants whose label starts with --baseline, `default` unless told): command start to PNG, its parts
before the run, the encode and CLIP's forward, the blocks' load, the first step against a steady one, the steady
step, the peak, with --reference each image's PSNR against that image (diffusers'), and with --diffusers each
run's command start to PNG against diffusers' in-script total in that result (issue 25's 0.5x row). Figures only:
nothing passes or fails here.
    python3 bench/variants_summary.py [--baseline default] [--reference diffusers.png] [--diffusers pipeline-all.json]
        WORK/pipeline-variant-*.json
"""
import argparse
import json
import pathlib
import re
import statistics
import sys

from pipeline_gpu_generate import psnr

GB = 1e9
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds_in_log(log: pathlib.Path, pattern: str):
    """The seconds a `--log-level` line reports for `pattern` (e.g. 'stage encode: CLIP forward'), or None."""
    if not log.exists():
        return None
    match = re.search(re.escape(pattern) + r" ([\d.]+) (us|ms|s)\b", log.read_text(errors="replace"))
    return float(match.group(1)) * UNITS[match.group(2)] if match else None


def in_script_total(result: pathlib.Path):
    """diffusers' in-script seconds (load, encode, denoise, decode) in a pipeline_gpu_generate.py result, or None."""
    if not result or not result.exists():
        return None
    phases = (json.loads(result.read_text()).get("diffusers") or {}).get("phases") or {}
    parts = [phases.get(p, {}).get("seconds") for p in ("load", "encode", "denoise", "decode")]
    return sum(parts) if all(p is not None for p in parts) else None


def figures(path: pathlib.Path, reference, theirs_seconds) -> dict:
    ours = json.loads(path.read_text())["diffpipe"]
    log = path.with_name(path.stem + "-files") / "diffpipe.log"
    stages = {s["name"]: s for s in ours["stages"]}
    to_png = ours.get("process_start_to_outputs_seconds")
    to_main = ours.get("process_start_to_main_seconds")
    return {
        "start to PNG (s)": to_png,
        "to PNG / diffusers": to_png / theirs_seconds if to_png and theirs_seconds else None,
        "start to main (s)": to_main,
        "main to the run (s)": to_png - ours["total_seconds"] - to_main if to_png and to_main is not None else None,
        "encode (s)": stages.get("encode", {}).get("seconds"),
        "CLIP forward (s)": seconds_in_log(log, "stage encode: CLIP forward"),
        "transformer load (s)": seconds_in_log(log, "stage denoise: transformer load"),
        "first / steady step": ours.get("first_step_ratio"),
        "steady step (ms)": ours.get("ms_per_step"),
        "peak (GB)": max((s.get("peak_device_bytes") or 0) for s in ours["stages"]) / GB,
        "PSNR (dB)": psnr(log.with_name("diffpipe.png"), reference) if reference and reference.exists() else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="default", help="label prefix of the runs the ratios are to")
    parser.add_argument("--reference", type=pathlib.Path, help="the image each run's PSNR is measured against")
    parser.add_argument("--diffusers", type=pathlib.Path,
                        help="a result with diffusers' side (pipeline-all.json): each run's ratio to its total")
    parser.add_argument("results", nargs="+", help="pipeline-variant-LABEL.json files")
    args = parser.parse_args()
    runs = {}
    theirs_seconds = in_script_total(args.diffusers)
    for name in args.results:
        path = pathlib.Path(name)
        label = path.stem.removeprefix("pipeline-variant-")
        try:
            runs[label] = figures(path, args.reference, theirs_seconds)
        except (OSError, KeyError, ValueError) as e:
            print(f"{label}: no figures ({e})")
    if not runs:
        return 1
    names = list(next(iter(runs.values())).keys())
    base = {n: [r[n] for l, r in runs.items() if l.startswith(args.baseline) and r[n] is not None] for n in names}
    base_mean = {n: statistics.mean(v) if v else None for n, v in base.items()}
    width = max(len(l) for l in runs) + 2
    print(f"\nvariants side by side (ratio to the mean of the '{args.baseline}*' runs in brackets)")
    print(f"{'figure':22}" + "".join(f"{l:>{max(width, 16)}}" for l in runs))
    for n in names:
        cells = []
        for r in runs.values():
            value, mean = r[n], base_mean[n]
            text = "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"
            if value is not None and mean:
                text += f" ({value / mean:.2f})"
            cells.append(f"{text:>{max(width, 16)}}")
        print(f"{n:22}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
