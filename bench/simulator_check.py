#!/usr/bin/env python3
"""Checks `plan --simulate` against what the runtime measured.

Runs `generate` over N ranks with --report, feeds each stage's measured compute time per microbatch step to
`plan --simulate --stage-ms`, and prints side by side: denoising wall time, images/s, each stage's busy share
and the bytes on every link, measured and simulated, with their ratio. The simulator replays the same ring
schedule, so with the measured stage times the two should agree up to what the model leaves out (the
coordinator's Euler update and loop overhead, host staging of the MPI transport, noise on a shared machine).

    python3 bench/simulator_check.py --diffpipe build/diffpipe --model FOLDER --ranks 2 3 -- [generate flags]

The generate flags must include what the plan needs to know (--height, --width, --steps, prompts, images per
prompt, --microbatch-size, --dtype, --device-map if not the default). Uses mpirun; as root set
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
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


def run_measured(diffpipe, model, ranks, generate_args, workdir):
    report = os.path.join(workdir, f"report-{ranks}.json")
    out = os.path.join(workdir, f"out-{ranks}.h5")
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), diffpipe, "generate", "--model", model,
           "--output-type", "latent", "--out", out, "--report", report] + generate_args
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"generate over {ranks} ranks failed:\n{done.stdout[-3000:]}")
    reports = {}
    for path in glob.glob(os.path.join(workdir, f"report-{ranks}.rank*.json")):
        with open(path) as f:
            doc = json.load(f)
        reports[doc["rank"]] = doc
    return reports


def simulate(diffpipe, model, ranks, generate_args, stage_ms, link_args):
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
           "--stage-ms", ",".join(f"{ms:.3f}" for ms in stage_ms)] + link_args
    for name in ("--height", "--width", "--max-memory"):
        value = flag_value(generate_args, name)
        if value:
            cmd += [name, value]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"plan --simulate failed: {done.stderr[-2000:]}")
    maps = json.loads(done.stdout)["simulation"]["maps"]
    return maps[0]["runs"][0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--diffpipe", default="build/diffpipe")
    parser.add_argument("--model", required=True)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--link-gbps", type=float, default=None,
                        help="link bandwidth for the simulation (default: measured from the reports)")
    parser.add_argument("--link-latency-us", type=float, default=20.0)
    parser.add_argument("generate_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    generate_args = [a for a in args.generate_args if a != "--"]

    with tempfile.TemporaryDirectory() as workdir:
        for ranks in args.ranks:
            reports = run_measured(args.diffpipe, args.model, ranks, generate_args, workdir)
            stages = sorted((r for r in reports.values() if r.get("blocks")), key=lambda r: r["blocks"][0])
            stage_ms = [1000.0 * r["compute_seconds"] / max(r["microbatch_steps"], 1) for r in stages]
            # The measured link speed: bytes a worker received over the seconds it spent receiving is a lower
            # bound (receive time includes waiting for the sender's compute), so use the send side when given.
            link_gbps = args.link_gbps
            if link_gbps is None:
                sent = sum(r["bytes_sent"] for r in reports.values())
                send_s = sum(r["send_seconds"] for r in reports.values())
                link_gbps = sent / 1e9 / send_s if send_s > 0 else 10.0
            sim = simulate(args.diffpipe, args.model, ranks, generate_args, stage_ms,
                           ["--link-gbps", f"{link_gbps:.3f}", "--link-latency-us", str(args.link_latency_us)])
            coordinator = reports[0]
            measured_wall = coordinator["denoise_wall_seconds"]
            images = sim["images"]
            print(f"\n{ranks} ranks: stage ms per microbatch step (measured) "
                  f"{', '.join(f'{ms:.1f}' for ms in stage_ms)}; link {link_gbps:.2f} GB/s")
            print(f"  {'':28} {'measured':>12} {'simulated':>12} {'sim/meas':>9}")
            rows = [("denoise wall s", measured_wall, sim["total_s"]),
                    ("images/s", images / measured_wall, sim["images_per_s"])]
            for st, r in zip(sim["stages"], stages):
                rows.append((f"rank {r['rank']} busy share", r["compute_seconds"] / measured_wall, st["busy_fraction"]))
            for link in sim["links"]:
                src = reports.get(link["from_rank"])
                rows.append((f"bytes {link['from_rank']}->{link['to_rank']}",
                             float(src["bytes_sent"]) if src else float("nan"), float(link["bytes_total"])))
            for name, m, s in rows:
                print(f"  {name:28} {m:12.4g} {s:12.4g} {s / m if m else float('nan'):9.3f}")


if __name__ == "__main__":
    main()
