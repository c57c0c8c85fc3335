#!/usr/bin/env python3
"""Checks `plan --simulate` against runs it was not calibrated on.

A simulator fed the measured stage times of the very run it is compared with only replays that run's
schedule: agreement there says nothing about its predictions. So this script calibrates on one run and
predicts others:

  1. calibration: `generate` over the --calibrate ranks at the --calibrate size, with --report. From each
     stage's measured compute per microbatch step and the blocks it holds it fits one time per double block
     and one per single block (least squares over the stages; one shared time when the stages cannot tell
     the two kinds apart), and takes the link speed from the bytes sent over the seconds spent sending;
  2. prediction, before each target run: `plan --simulate --block-times D,S --block-times-at <calibration
     size>` for the target's ranks and size (plan scales the block times by FLOPs to the target shape);
  3. the target run itself, and the prediction's error against it: denoise wall time, images/s, and each
     stage's compute per microbatch step.
A target identical to the calibration run (same ranks and size) is refused: that would be in-sample. For
each target the script also prints, apart and labelled as such, the simulator fed that target's own measured
stage times: that in-sample figure isolates the schedule model from the stage-time prediction.

    python3 bench/simulator_check.py --diffpipe build/diffpipe --model FOLDER --calibrate 2:256x256 \\
        --predict 2:512x512 3:512x512 -- [generate flags]

With --calibrated the block times come instead from `diffpipe calibrate`, run in one process at each target's
size, dtype, text tokens and microbatch size (with OMP_NUM_THREADS threads, default 1, as each rank runs), and
`plan --simulate --calibration FILE` predicts from them: the calibrated simulator against the measured runs.

    OMP_NUM_THREADS=1 python3 bench/simulator_check.py --diffpipe build/diffpipe --model TINY --calibrated \
        --predict 2:256x256 3:256x256 -- --prompt a --prompt b --num-images-per-prompt 2 --steps 3 \
        --dtype fp32 --max-sequence-length 64

The generate flags give the rest of the request (prompts, --num-images-per-prompt, --steps,
--microbatch-size, --dtype, --device, --device-map); not --height/--width, which each run sets. plan is given
the run's --max-sequence-length as its --text-tokens. Uses mpirun; as root set
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1. Prints figures; it passes or fails nothing.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile


def flag_value(args, name, default=None):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def count_flag(args, name):
    return sum(1 for a in args if a == name)


def parse_target(text):
    """"RANKS:HxW" -> (ranks, height, width)."""
    try:
        ranks, size = text.split(":")
        height, width = size.lower().split("x")
        return int(ranks), int(height), int(width)
    except ValueError:
        sys.exit(f"'{text}' is not RANKS:HEIGHTxWIDTH, as in 2:512x512")


def label(target):
    return f"{target[0]} rank(s) at {target[1]}x{target[2]}"


def run_measured(diffpipe, model, target, generate_args, workdir):
    ranks, height, width = target
    base = os.path.join(workdir, f"report-{ranks}-{height}x{width}")
    out = base + ".h5"
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), diffpipe, "generate", "--model", model,
           "--output-type", "latent", "--out", out, "--report", base + ".json",
           "--height", str(height), "--width", str(width)] + generate_args
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"generate, {label(target)}, failed:\n{done.stdout[-3000:]}")
    reports = {}
    for path in glob.glob(base + ".rank*.json"):
        with open(path) as f:
            doc = json.load(f)
        reports[doc["rank"]] = doc
    return reports


def stages_of(reports):
    """The ring's stages in block order: (report, measured ms of compute per microbatch step)."""
    stages = sorted((r for r in reports.values() if r.get("blocks")), key=lambda r: r["blocks"][0])
    return [(r, 1000.0 * r["compute_seconds"] / max(r["microbatch_steps"], 1)) for r in stages]


def fit_block_times(stages, double_blocks):
    """Least squares for ms per double block d and per single block s from stage = n_double d + n_single s.
    Returns (d, s, how)."""
    rows = []
    for report, ms in stages:
        first, last = report["blocks"]
        n_double = max(0, min(last, double_blocks) - first)
        rows.append((n_double, (last - first) - n_double, ms))
    a11 = sum(nd * nd for nd, _, _ in rows)
    a12 = sum(nd * ns for nd, ns, _ in rows)
    a22 = sum(ns * ns for _, ns, _ in rows)
    b1 = sum(nd * ms for nd, _, ms in rows)
    b2 = sum(ns * ms for _, ns, ms in rows)
    det = a11 * a22 - a12 * a12
    if abs(det) > 1e-9 * max(a11 * a22, 1.0):
        d, s = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
        if d > 0 and s > 0:
            return d, s, f"least squares over {len(rows)} stages"
    per_block = sum(ms for _, _, ms in rows) / max(sum(nd + ns for nd, ns, _ in rows), 1)
    return per_block, per_block, f"one time for both kinds ({len(rows)} stage(s) cannot separate them)"


def link_speed(reports, given):
    if given is not None:
        return given
    # Bytes over the seconds spent sending: the receive side would count the sender's compute as well.
    sent = sum(r["bytes_sent"] for r in reports.values())
    send_s = sum(r["send_seconds"] for r in reports.values())
    return sent / 1e9 / send_s if send_s > 0 else 10.0


def simulate(diffpipe, model, target, generate_args, timing_args, link_gbps, latency_us):
    ranks, height, width = target
    prompts = count_flag(generate_args, "--prompt")
    prompts_file = flag_value(generate_args, "--prompts-file")
    if prompts_file:
        with open(prompts_file) as f:
            prompts += sum(1 for line in f if line.strip())
    cmd = [diffpipe, "plan", "--model", model, "--world-size", str(ranks), "--simulate", "--json",
           "--device-map", flag_value(generate_args, "--device-map", "pipeline"),
           "--prompts", str(max(prompts, 1)),
           "--images-per-prompt", flag_value(generate_args, "--num-images-per-prompt", "1"),
           "--steps", flag_value(generate_args, "--steps", "28"),
           "--microbatch-size", flag_value(generate_args, "--microbatch-size", "1"),
           "--dtype", flag_value(generate_args, "--dtype", "fp32"),
           "--height", str(height), "--width", str(width),
           "--text-tokens", flag_value(generate_args, "--max-sequence-length", "512"),
           "--link-gbps", f"{link_gbps:.4f}", "--link-latency-us", str(latency_us)] + timing_args
    value = flag_value(generate_args, "--max-memory")
    if value:
        cmd += ["--max-memory", value]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"plan --simulate failed: {done.stderr[-2000:]}")
    simulated = json.loads(done.stdout)["simulation"]["maps"][0]
    return simulated["stage_ms"], simulated["runs"][0]


def calibrate(diffpipe, model, target, generate_args, workdir):
    """`diffpipe calibrate` at the target's size: the plan arguments that use it. The file's key holds the
    transformer's shape (a tiny VAE's factor makes it differ from --height/--width), which plan is given."""
    ranks, height, width = target
    path = os.path.join(workdir, f"calibration-{ranks}-{height}x{width}.json")
    cmd = [diffpipe, "calibrate", "--model", model, "--height", str(height), "--width", str(width),
           "--dtype", flag_value(generate_args, "--dtype", "fp32"),
           "--device", flag_value(generate_args, "--device", "cpu"),
           "--text-tokens", flag_value(generate_args, "--max-sequence-length", "512"),
           "--microbatch-size", flag_value(generate_args, "--microbatch-size", "1"),
           "--threads", os.environ.get("OMP_NUM_THREADS", "1"), "--warmup", "2", "--repeat", "5",
           "--calibration", path]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"calibrate, {label(target)}, failed:\n{done.stdout[-3000:]}")
    with open(path) as f:
        entry = json.load(f)["entries"][-1]
    print(f"calibrate at {label(target)} ({entry['device']}): double {entry['double_block_ms']:.3f} ms, "
          f"single {entry['single_block_ms']:.3f} ms, embedders {entry['embedders_ms']:.3f} ms, "
          f"output {entry['output_ms']:.3f} ms per microbatch of {entry['microbatch']}")
    return ["--calibration", path], (entry["height"], entry["width"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--diffpipe", default="build/diffpipe")
    parser.add_argument("--model", required=True)
    parser.add_argument("--calibrate", default="2:256x256", help="RANKS:HxW of the calibration run")
    parser.add_argument("--predict", nargs="+", default=["2:512x512", "3:512x512"], help="RANKS:HxW targets")
    parser.add_argument("--link-gbps", type=float, default=None,
                        help="link bandwidth for the simulation (default: measured in the calibration run)")
    parser.add_argument("--link-latency-us", type=float, default=20.0)
    parser.add_argument("--calibrated", action="store_true",
                        help="predict from `diffpipe calibrate` at each target instead of a calibration run")
    parser.add_argument("generate_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    generate_args = [a for a in args.generate_args if a != "--"]
    for name in ("--height", "--width", "--out", "--report"):
        if flag_value(generate_args, name) is not None:
            sys.exit(f"{name}: each run sets it; leave it out of the generate flags")
    calibration = parse_target(args.calibrate)
    targets = [parse_target(t) for t in args.predict]
    for target in targets:
        if target == calibration and not args.calibrated:
            sys.exit(f"{label(target)} is the calibration run itself: an in-sample check; pick another target")
    with open(os.path.join(args.model, "transformer", "config.json")) as f:
        double_blocks = json.load(f)["num_layers"]

    if args.calibrated:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        with tempfile.TemporaryDirectory() as workdir:
            check_calibrated(args, generate_args, targets, workdir)
        return
    with tempfile.TemporaryDirectory() as workdir:
        reports = run_measured(args.diffpipe, args.model, calibration, generate_args, workdir)
        stages = stages_of(reports)
        d, s, how = fit_block_times(stages, double_blocks)
        link_gbps = link_speed(reports, args.link_gbps)
        print(f"calibration: {label(calibration)}; stage ms per microbatch step "
              f"{', '.join(f'{ms:.2f}' for _, ms in stages)}; fitted block times {d:.3f} ms (double), "
              f"{s:.3f} ms (single), {how}; link {link_gbps:.2f} GB/s")
        timing = ["--block-times", f"{d:.4f},{s:.4f}", "--block-times-at", f"{calibration[1]}x{calibration[2]}"]
        summary = []
        for target in targets:
            predicted_ms, predicted = simulate(args.diffpipe, args.model, target, generate_args, timing, link_gbps,
                                               args.link_latency_us)
            reports = run_measured(args.diffpipe, args.model, target, generate_args, workdir)
            measured_stages = stages_of(reports)
            measured_wall = reports[0]["denoise_wall_seconds"]
            images = predicted["images"]
            _, replay = simulate(args.diffpipe, args.model, target, generate_args,
                                 ["--stage-ms", ",".join(f"{ms:.3f}" for _, ms in measured_stages)],
                                 link_speed(reports, args.link_gbps), args.link_latency_us)
            print_prediction(f"{label(target)}: predicted from the calibration run, then measured", predicted,
                             predicted_ms, measured_stages, measured_wall)
            print(f"  in-sample, for reference only (the simulator fed this run's own stage times): "
                  f"{replay['total_s']:.3f} s, {(replay['total_s'] / measured_wall - 1) * 100:+.1f}%")
            summary.append((target, predicted["images_per_s"], images / measured_wall))
        print("\nout-of-sample throughput error (predicted / measured images/s - 1):")
        for target, p, m in summary:
            print(f"  {label(target):28} {(p / m - 1) * 100:+6.1f}%  (predicted {p:.4g}, measured {m:.4g})")


def print_prediction(title, predicted, predicted_ms, measured_stages, measured_wall):
    """One target's table: the simulator's wall, throughput and stage times beside the measured ones."""
    print(f"\n{title}")
    print(f"  {'':30} {'predicted':>10} {'measured':>10} {'error':>8}")
    rows = [("denoise wall s", predicted["total_s"], measured_wall),
            ("images/s", predicted["images_per_s"], predicted["images"] / measured_wall)]
    for ms, (report, measured_ms) in zip(predicted_ms, measured_stages):
        rows.append((f"rank {report['rank']} stage ms/step", ms, measured_ms))
    for name, p, m in rows:
        print(f"  {name:30} {p:10.4g} {m:10.4g} {(p / m - 1) * 100 if m else float('nan'):7.1f}%")


def check_calibrated(args, generate_args, targets, workdir):
    """The calibrated simulator against measured runs: error printed, nothing passed or failed."""
    summary = []
    for target in targets:
        timing, (plan_height, plan_width) = calibrate(args.diffpipe, args.model, target, generate_args, workdir)
        link = args.link_gbps if args.link_gbps is not None else 10.0
        predicted_ms, predicted = simulate(args.diffpipe, args.model, (target[0], plan_height, plan_width),
                                           generate_args, timing, link, args.link_latency_us)
        reports = run_measured(args.diffpipe, args.model, target, generate_args, workdir)
        measured_stages = stages_of(reports)
        measured_wall = reports[0]["denoise_wall_seconds"]
        images = predicted["images"]
        print_prediction(f"{label(target)}: predicted from calibrate, then measured (link {link:.2f} GB/s)",
                         predicted, predicted_ms, measured_stages, measured_wall)
        summary.append((target, predicted["images_per_s"], images / measured_wall))
    print("\ncalibrated simulator, throughput error (predicted / measured images/s - 1):")
    for target, p, m in summary:
        print(f"  {label(target):28} {(p / m - 1) * 100:+6.1f}%  (predicted {p:.4g}, measured {m:.4g})")


if __name__ == "__main__":
    main()
