"""`diffpipe generate --sequence-parallel K` on meshes of S stage groups x K ranks under a real mpirun (CPU,
fp32, MPI transport, --oversubscribe).

    sequence_parallel_test.py CASE [--ranks N]

Cases:
  meshes    every mesh S x K of N ranks (N = 2: 1x2 and 2x1; 3: 1x3 and 3x1; 4: 1x4 and 2x2) on a tiny model with
            12 attention heads gives packed latents within 1e-6 of one process's scale (the output says whether
            they are bit-identical); 1 x N also with --microbatch-size 2. With N = 4, --report on the 2 x 2 mesh
            records each rank's group, shard and all-to-alls (two per block and microbatch step, bytes symmetric in
            each group) and the coordinator's scatter to and gather from every shard.
  refused   a K that does not divide the world, one that does not divide the heads, and K > 1 in a world of one
            are refused on every rank before anything loads, naming the valid values.
  killed    on a 2 x 2 mesh, rank 1 (rank 0's partner in the first group's all-to-alls) is killed with SIGKILL
            mid-run: the job ends non-zero within 30 s and the output names the rank.

Needs DIFFPIPE_BINARY (the built diffpipe) and h5py/numpy (the pinned venv)."""
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from mpi_case import fail, mpirun, run, run_case  # noqa: E402
from mpi_generate_test import BOUND_SECONDS, generate_args, latents, run_and_kill_rank  # noqa: E402

TOLERANCE = 1e-6  # max abs difference relative to the latents' scale
HEADS = 12        # splits 2, 3 and 4 ways (FLUX.1-dev has 24)
MESHES = {2: [(1, 2), (2, 1)], 3: [(1, 3), (3, 1)], 4: [(1, 4), (2, 2)]}


def compare(got, reference, what):
    if got.shape != reference.shape:
        fail(f"{what}: latents of shape {got.shape}, one process {reference.shape}")
    error = float(np.abs(got - reference).max()) / float(np.abs(reference).max())
    if not error <= TOLERANCE:
        fail(f"{what}: latents differ from one process by {error:.3g} of the scale (> {TOLERANCE})")
    return error, bool(np.array_equal(got, reference))


def mesh_run(binary, model, tmp, ranks, k, name, extra=()):
    out = tmp / f"{name}.h5"
    args = generate_args(model, out, ["--sequence-parallel", str(k)] + list(extra))
    code, output, seconds = run(mpirun(ranks) + [binary] + args)
    if code != 0:
        fail(f"{name}: exited {code}:\n{output}")
    if k > 1 and f"x {k} sequence-parallel ranks" not in output:
        fail(f"{name}: the start-up log does not describe the mesh:\n{output}")
    return latents(out), seconds


def check_reports(tmp, stem, ranks, k):
    docs = [json.loads((tmp / f"{stem}.rank{r}.json").read_text()) for r in range(ranks)]
    steps = 3 * 4  # 3 steps x 4 single-image microbatches
    for doc in docs:
        r, mesh = doc["rank"], doc["mesh"]
        if mesh["sequence_parallel"] != k or mesh["stage_group"] != r // k or mesh["shard"] != r % k:
            fail(f"rank {r}'s report places it at {mesh}")
        a2a = doc["all_to_all"]
        # Two all-to-alls around the attention of every block this rank runs, for every microbatch step.
        expected = 2 * (doc["blocks"][1] - doc["blocks"][0]) * doc["microbatch_steps"]
        if doc["microbatch_steps"] != steps or a2a["calls"] != expected or not a2a["bytes_sent"] > 0:
            fail(f"rank {r}: {doc['microbatch_steps']} microbatch steps, all-to-alls {a2a}; expected {steps} steps "
                 f"and {expected} calls")
        if not 0 < a2a["seconds"] <= doc["compute_seconds"] + 1e-9:
            fail(f"rank {r}: all-to-all seconds {a2a['seconds']} outside (0, compute {doc['compute_seconds']}]")
        per_step = sum(s["all_to_all_seconds"] for s in doc["per_step"])
        if abs(per_step - a2a["seconds"]) > 1e-6 * max(1.0, a2a["seconds"]):
            fail(f"rank {r}: per-step all-to-all seconds sum to {per_step}, the total is {a2a['seconds']}")
    for group in range(ranks // k):
        members = [docs[group * k + j] for j in range(k)]
        sent = sum(m["all_to_all"]["bytes_sent"] for m in members)
        received = sum(m["all_to_all"]["bytes_received"] for m in members)
        if sent != received:
            fail(f"group {group}: its ranks sent {sent} all-to-all bytes and received {received}")
    coordinator = docs[0]
    if sorted(coordinator["receives_from_ranks"]) != list(range(ranks - k, ranks)):
        fail(f"rank 0 gathers from {coordinator['receives_from_ranks']}, expected the last group")
    print(f"2 x 2 reports: all-to-alls {[d['all_to_all']['calls'] for d in docs]} calls, "
          f"{[d['all_to_all']['bytes_sent'] for d in docs]} bytes out, "
          f"{[round(d['all_to_all']['seconds'], 3) for d in docs]} s; blocks {[d['blocks'] for d in docs]}")


def case_meshes(binary, model, tmp, ranks):
    code, output, one_seconds = run([binary] + generate_args(model, tmp / "one.h5"))
    if code != 0:
        fail(f"one process exited {code}:\n{output}")
    reference = latents(tmp / "one.h5")
    for stages, k in MESHES[ranks]:
        name = f"mesh-{stages}x{k}"
        extra = ["--report", str(tmp / "report.json")] if (stages, k) == (2, 2) else []
        got, seconds = mesh_run(binary, model, tmp, ranks, k, name, extra)
        error, identical = compare(got, reference, name)
        print(f"{stages} x {k}: {'bit-identical' if identical else f'max difference {error:.3g} of the scale'} "
              f"({seconds:.1f} s; one process {one_seconds:.1f} s)")
        if extra:
            check_reports(tmp, "report", ranks, k)
    got, _ = mesh_run(binary, model, tmp, ranks, ranks, f"mesh-1x{ranks}-mb2", ["--microbatch-size", "2"])
    error, identical = compare(got, reference, f"1 x {ranks}, --microbatch-size 2")
    print(f"1 x {ranks}, microbatches of 2: {'bit-identical' if identical else f'{error:.3g} of the scale'}")


def case_refused(binary, model, tmp, ranks):
    # The default tiny model has 2 heads: with 3 ranks only K = 1 and 3 divide the world, and of those only 1
    # the heads.
    tiny2 = tmp / "tiny2"
    code, output, _ = run([binary, "make-tiny", "--out", str(tiny2)])
    if code != 0:
        fail(f"make-tiny exited {code}:\n{output}")
    cases = [(mpirun(ranks), model, 2, f"does not divide the world of {ranks}", f"world of {ranks} rank(s): 1, 3"),
             (mpirun(ranks), tiny2, 3, "does not divide the transformer's 2 attention heads",
              f"world of {ranks} rank(s): 1 ["),
             ([], model, 2, "does not divide the world of 1", "world of 1 rank(s): 1 [")]
    for launcher, model_dir, k, reason, valid in cases:
        out = tmp / "x.h5"
        what = f"--sequence-parallel {k} in a world of {ranks if launcher else 1} ({model_dir.name})"
        code, output, seconds = run(launcher + [binary] + generate_args(model_dir, out, ["--sequence-parallel", str(k)]),
                                    timeout=BOUND_SECONDS + 30)
        if code == 0 or seconds > BOUND_SECONDS:
            fail(f"{what}: exit {code} after {seconds:.1f} s:\n{output}")
        for text in (reason, valid):
            if text not in output:
                fail(f"{what}: the output does not say '{text.strip()}':\n{output}")
        if "loaded blocks" in output or "stage encode" in output or out.exists():
            fail(f"{what}: refused only after loading began:\n{output}")
        print(f"{what}: refused in {seconds:.1f} s before loading, naming the valid values")


def case_killed(binary, model, tmp, ranks):
    out = tmp / "killed.h5"
    victim = 1
    args = generate_args(model, out, ["--sequence-parallel", "2", "--steps", "400", "--transport-timeout", "20"])
    code, text, killed_at = run_and_kill_rank(mpirun(ranks) + [binary] + args, victim, out, "progress 1/400",
                                              "the run neither reached step 1 nor ended")
    if killed_at is None:
        fail(f"the run ended before step 1 (exit {code}):\n{text}")
    seconds = time.monotonic() - killed_at
    if code == 0:
        fail(f"killing rank {victim} mid-run still exited 0:\n{text}")
    if seconds > BOUND_SECONDS:
        fail(f"the job took {seconds:.1f} s to end after rank {victim} was killed (bound {BOUND_SECONDS} s)")
    if f"rank {victim}" not in text:
        fail(f"the output does not name rank {victim}:\n{text}")
    if out.exists():
        fail("a killed run left its output file")
    print(f"2 x 2 mesh, rank {victim} killed with SIGKILL at step 1: job exit {code} {seconds:.1f} s later, rank named")


CASES = {"meshes": case_meshes, "refused": case_refused, "killed": case_killed}


if __name__ == "__main__":
    run_case(CASES, "diffpipe-sp", default_ranks=4, model_name="tiny12", make_tiny_args=["--attention-heads", str(HEADS)])
