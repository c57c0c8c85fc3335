#!/usr/bin/env python3
"""`diffpipe generate` with LoRA adapters, true CFG, custom sigmas and initial latents against diffusers, at N ranks.

    lora_oracle_test.py --reference DIR [--ranks N] [--only CASE]

DIR is what tests/reference/cases_lora.py wrote (the ctest fixture's reference/lora). Every case runs in each of
its modes (--lora-mode fused and unfused: diffusers' set_adapters result is the same number either way), under
`mpirun --oversubscribe -np N` when N > 1 (the transformer split over the ranks, microbatches of one image, true
CFG's two passes travelling separately). The packed latents must equal diffusers' within 1e-4 of their scale
(fp32 CPU, the pipeline oracle's tolerance), and differ from the plain call (no adapters, no CFG, default sigmas,
seeded latents) by far more, so a dropped adapter or an ignored option cannot pass. Prints each case's relative
max error. Needs DIFFPIPE_BINARY and the pinned venv (h5py, safetensors)."""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
from safetensors.numpy import load_file

TOLERANCE = 1e-4      # max abs error over the latents' max abs, as the pipeline oracle
MIN_EFFECT = 1e-3     # what the case changes against the plain call, relative; measured >= 2e-2


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


# Cases also run with CLIP and T5 on rank 1 (--pipeline-device-map balanced): text-encoder adapters applied on
# that rank, the negative prompts encoded there and sent to rank 0.
ON_ENCODER_RANK = {"bfl_alpha_2", "true_cfg_lora"}


def command_for(binary, case, mode, out, ranks, encoders_on_rank_1=False):
    call = case["call"]
    command = []
    if ranks > 1:
        command = ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS=1"]
    command += [binary, "generate", "--model", case["pipeline"], "--dtype", "fp32", "--device", "cpu",
                "--height", str(call["height"]), "--width", str(call["width"]), "--guidance", str(call["guidance_scale"]),
                "--seed", str(call["seed"]), "--max-sequence-length", str(call["max_sequence_length"]),
                "--num-images-per-prompt", str(call["num_images_per_prompt"]), "--output-type", "latent",
                "--out", str(out), "--microbatch-size", "1"]
    if call.get("sigmas"):
        command += ["--sigmas", ",".join(repr(s) for s in call["sigmas"])]
    else:
        command += ["--steps", str(call["steps"])]
    for prompt in case["prompts"]:
        command += ["--prompt", prompt]
    for negative in call.get("negative_prompt", []):
        command += ["--negative-prompt", negative]
    if "true_cfg_scale" in call:
        command += ["--true-cfg-scale", str(call["true_cfg_scale"])]
    for adapter in case["adapters"]:
        command += ["--lora", f"{adapter['name']}={adapter['path']}:{adapter['scale']!r}"]
    if case["adapters"]:
        command += ["--lora-mode", mode]
    if case.get("latents"):
        command += ["--latents", case["latents"]]
    if encoders_on_rank_1:
        command += ["--pipeline-device-map", "balanced", "--max-memory", "1=1GB"]
    return command


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", required=True)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--only", action="append")
    args = parser.parse_args()
    binary = os.environ.get("DIFFPIPE_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        fail("set DIFFPIPE_BINARY to the built diffpipe executable")
    reference = pathlib.Path(args.reference)
    if not (reference / "cases.json").exists():
        fail(f"{reference}: no cases.json (run tests/reference/cases_lora.py first)")
    names = json.loads((reference / "cases.json").read_text())
    if args.only:
        names = [n for n in names if n in args.only]
    if not names:
        fail("no case to run")
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="diffpipe-lora-") as tmp:
        for name in names:
            case = json.loads((reference / name / "case.json").read_text())
            # Paths are absolute as written; a reference folder written with a relative --out resolves here.
            case["pipeline"] = str(reference / case["pipeline"]) if not os.path.isabs(case["pipeline"]) else case["pipeline"]
            expected = load_file(str(reference / name / "expected.safetensors"))
            scale = float(np.abs(expected["latents"]).max())
            effect = float(np.abs(expected["latents"] - expected["plain"]).max()) / scale
            if not effect > MIN_EFFECT:
                fail(f"{name}: the reference itself barely differs from the plain call ({effect:.3g})")
            runs = [(mode, False) for mode in case["modes"]]
            if args.ranks > 1 and name in ON_ENCODER_RANK:
                runs += [(mode, True) for mode in case["modes"]]
            for mode, encoders_on_rank_1 in runs:
                out = pathlib.Path(tmp) / f"{name}-{mode}-{encoders_on_rank_1}.h5"
                command = command_for(binary, case, mode, out, args.ranks, encoders_on_rank_1)
                where = ", encoders on rank 1" if encoders_on_rank_1 else ""
                started = time.monotonic()
                result = subprocess.run(command, capture_output=True, text=True, timeout=600)
                if result.returncode != 0:
                    fail(f"{name} ({mode}, {args.ranks} rank(s){where}) exited {result.returncode}:\n{' '.join(command)}\n"
                         f"{result.stdout}\n{result.stderr}")
                with h5py.File(out, "r") as f:
                    got = np.asarray(f["latents"], dtype=np.float32)
                if got.shape != expected["latents"].shape:
                    fail(f"{name} ({mode}): latents {got.shape}, diffusers {expected['latents'].shape}")
                error = float(np.abs(got - expected["latents"]).max()) / scale
                worst = max(worst, error)
                print(f"{name:18s} {mode:8s} {args.ranks} rank(s){where}: relative max error {error:.3g} "
                      f"(the case moves the latents by {effect:.3g}) in {time.monotonic() - started:.1f} s", flush=True)
                if not error <= TOLERANCE:
                    fail(f"{name} ({mode}, {args.ranks} rank(s){where}): latents differ from diffusers by {error:.3g} of "
                         f"their scale > {TOLERANCE}\n{' '.join(command)}")
    print(f"OK: {len(names)} case(s) at {args.ranks} rank(s) equal diffusers; worst relative error {worst:.3g}")


if __name__ == "__main__":
    main()
