#!/usr/bin/env python3
"""Every command of the README's quickstart must parse and pass the checks that need no GPU and no weights.

The quickstart's `diffpipe ...` commands are taken from README.md's "Quickstart" section as written. FLUX.1-dev is
stood in for by make-tiny's folder: /data/FLUX.1-dev becomes that folder, and the model id
black-forest-labs/FLUX.1-dev a Hugging Face cache (HF_HUB_CACHE) holding it. `plan` runs as it is; `generate`
gets --dry-run (it would need a GPU and the weights), under mpirun when the line starts with it. An sbatch line
must name a batch script that exists and parses (bash -n) and a config that exists.

Needs DIFFPIPE_BINARY (the built diffpipe) and mpirun. Exits non-zero naming the first command that failed."""
import hashlib
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("DIFFPIPE_BINARY", "")


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def quickstart_commands():
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Quickstart.*?$(.*?)^## ", text, re.S | re.M)
    if match is None:
        fail("README.md has no '## Quickstart' section")
    if re.search(r"^## ", text, re.M).start() != text.index("## Quickstart"):
        fail("the quickstart is not the README's first section")
    commands = []
    for line in match.group(1).splitlines():
        if not line.startswith("       ") or line.strip().startswith("#"):
            continue  # commands are the indented code lines; comments are not run
        commands.append(line.strip())
    return commands


def cached(tiny, cache):
    repo = cache / "models--black-forest-labs--FLUX.1-dev"
    commit = "f" * 40
    for path in sorted(tiny.rglob("*")):
        if path.is_file():
            blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(path.read_bytes())
            link = repo / "snapshots" / commit / path.relative_to(tiny)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def main():
    if not BINARY:
        fail("set DIFFPIPE_BINARY to the built diffpipe")
    commands = quickstart_commands()
    diffpipe_commands = [c for c in commands if re.search(r"(^|\s)diffpipe\s", c)]
    if len(diffpipe_commands) < 3:
        fail(f"expected the quickstart's plan, one-GPU and two-GPU commands, found: {diffpipe_commands}")
    with tempfile.TemporaryDirectory(prefix="diffpipe-quickstart-") as tmp:
        tmp = pathlib.Path(tmp)
        tiny = tmp / "tiny"
        made = subprocess.run([BINARY, "make-tiny", "--out", str(tiny)], capture_output=True, text=True)
        if made.returncode != 0:
            fail(f"make-tiny: {made.stderr}")
        cached(tiny, tmp / "hub")
        env = dict(os.environ, HF_HUB_CACHE=str(tmp / "hub"), HF_HUB_OFFLINE="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                   OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        checked = 0
        for command in commands:
            words = [w.replace("/data/FLUX.1-dev", str(tiny)) for w in shlex.split(command)]
            if "sbatch" in words:
                script = ROOT / words[-1]
                config = next((w.split("=", 1)[1] for w in words if w.startswith("CONFIG=")), None)
                if not script.is_file() or subprocess.run(["bash", "-n", str(script)]).returncode != 0:
                    fail(f"{command}: {script} is not a batch script that parses")
                if config is None or not (ROOT / config).is_file():
                    fail(f"{command}: CONFIG names no file of the repository")
                checked += 1
                continue
            if "diffpipe" not in words:
                continue
            at = words.index("diffpipe")
            launcher = words[:at]
            if launcher and launcher[0] == "mpirun":
                launcher = launcher[:1] + ["--oversubscribe", "-x", "HF_HUB_CACHE"] + launcher[1:]
            args = words[at + 1:]
            if args[0] == "generate":
                args = args + ["--dry-run"]  # writes nothing; its paths are still checked
            result = subprocess.run(launcher + [BINARY] + args, capture_output=True, text=True, env=env, cwd=ROOT,
                                    timeout=300)
            if result.returncode != 0:
                fail(f"`{command}` (run as {' '.join(launcher + ['diffpipe'] + args)}) exited {result.returncode}:\n"
                     f"{result.stdout}\n{result.stderr}")
            if args[0] == "generate" and "dry run: the request is valid" not in result.stdout:
                fail(f"`{command}` did not say the request is valid:\n{result.stdout}\n{result.stderr}")
            print(f"ok: {command}")
            checked += 1
        if checked < 4:
            fail(f"only {checked} quickstart commands were checked")
    print("PASS")


if __name__ == "__main__":
    main()
