"""What the tests/mpi case scripts share: a failure that ends the script with a message, the mpirun launcher,
a bounded command run, and main(): pick a CASE, check the environment, make the tiny model in a fresh
temporary folder and run the case there.

A script defines CASES = {"name": function} and ends with

    if __name__ == "__main__":
        run_case(CASES, "diffpipe-NAME", default_ranks=3)

Each case is called as case(binary, model, tmp, ...): `binary` the diffpipe under test (DIFFPIPE_BINARY),
`model` the tiny model folder, `tmp` the temporary folder (a pathlib.Path), then what case_args gives
((ranks,) by default, or nothing where the script has no --ranks)."""
import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def mpirun(ranks):
    return ["mpirun", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS=1"]


def run(command, timeout=600):
    """Runs `command`; returns its exit code, stdout and stderr together, and the seconds it took."""
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def diffpipe_binary():
    """DIFFPIPE_BINARY, which must name an executable; fails the script otherwise."""
    binary = os.environ.get("DIFFPIPE_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        fail("set DIFFPIPE_BINARY to the built diffpipe executable")
    return binary


def require_mpirun():
    if shutil.which("mpirun") is None:
        fail("mpirun is not on PATH (launch/setup.sh installs Open MPI)")


def run_case(cases, tmp_prefix, default_ranks=None, mpirun_for_one_rank=True, model_name="tiny",
             make_tiny_args=(), add_options=None, case_args=None):
    """The scripts' main(). default_ranks: the --ranks option's default (None: the script has no --ranks).
    mpirun_for_one_rank: whether mpirun must be there when --ranks is 1 (cases that run one rank without it say
    False). add_options(parser) adds a script's own options; case_args(args) gives what the case takes after
    (binary, model, tmp)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=sorted(cases))
    if default_ranks is not None:
        parser.add_argument("--ranks", type=int, default=default_ranks)
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args()
    binary = diffpipe_binary()
    if mpirun_for_one_rank or args.ranks > 1:
        require_mpirun()
    if case_args is None:
        case_args = (lambda parsed: (parsed.ranks,)) if default_ranks is not None else (lambda parsed: ())
    with tempfile.TemporaryDirectory(prefix=f"{tmp_prefix}-{args.case}-") as tmp:
        tmp = pathlib.Path(tmp)
        model = tmp / model_name
        code, output, _ = run([binary, "make-tiny", "--out", str(model)] + list(make_tiny_args))
        if code != 0:
            fail(f"make-tiny exited {code}:\n{output}")
        cases[args.case](binary, model, tmp, *case_args(args))
    print("1 passed, 0 failed")
