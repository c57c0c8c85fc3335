#!/usr/bin/env python3
"""Runs every tests/reference/cases_*.py oracle script, each into OUT/<area>, then marks OUT/DONE.

Each script creates tiny random models with save_pretrained and writes inputs and the pinned
diffusers/transformers/accelerate outputs that the C++ tests compare against."""
import argparse
import os
import pathlib
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", action="append", help="run only these areas (e.g. flux)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "DONE").unlink(missing_ok=True)
    here = pathlib.Path(__file__).resolve().parent
    scripts = sorted(here.glob("cases_*.py"))
    if not scripts:
        print("no cases_*.py scripts found", file=sys.stderr)
        return 1
    for script in scripts:
        area = script.stem[len("cases_"):]
        if args.only and area not in args.only:
            continue
        started = time.time()
        print(f"[oracle] {area} ...", flush=True)
        env = dict(os.environ, PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        result = subprocess.run([sys.executable, str(script), "--out", str(out / area)], env=env)
        if result.returncode != 0:
            print(f"[oracle] {area} failed with exit code {result.returncode}", file=sys.stderr)
            return result.returncode
        print(f"[oracle] {area} done in {time.time() - started:.1f}s", flush=True)
    (out / "DONE").write_text("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
