"""Checkpoints and --resume of `diffpipe generate`, on 1 rank (no launcher) or N ranks under mpirun (CPU, fp32).

    checkpoint_test.py CASE [--ranks N] [--at first|middle|last]

Cases:
  signal          the run holds at step k (DIFFPIPE_TEST_HOLD_AT_STEP, a test hook that waits for a signal), gets
                  SIGUSR1 (from mpirun with N ranks, to the process with 1), must exit 75 having written a
                  checkpoint of step k; --resume DIR then gives final latents bit-identical to an uninterrupted run.
  signal-rank0    as signal, with SIGUSR1 sent to rank 0's process only (N ranks).
  signal-worker   as signal, with SIGTERM and then (another run) SIGUSR1 sent to the last rank's process only
                  (N ranks): every rank exits 75 with the checkpoint written (a worker's signal used to be
                  swallowed: no checkpoint, exit 0).
  signal-twice    two copies of SIGUSR1 to every rank 50 ms apart (SLURM's batch signal forwarded by the job
                  script): one stop request, every rank exits 75 with the checkpoint (the copy used to kill them).
  sigterm         as signal with SIGTERM (1 rank).
  killed          --checkpoint-every 1; at step k a rank is killed with SIGKILL; the job ends non-zero, and
                  --resume DIR (its newest checkpoint, step k) gives the bit-identical result.
  world-size      a checkpoint written on N ranks resumes on 1 rank and on 2 ranks to the same latents.
  mesh            a checkpoint written on a 2 x 2 mesh (--sequence-parallel 2 on 4 ranks, stopped by SIGUSR1)
                  resumes on 1 rank, and one written on 1 rank resumes on the 2 x 2 mesh: both within 1e-6 of the
                  uninterrupted run's scale (a mesh splits its GEMMs differently, so not bit for bit).
  refused         corrupt, truncated, newer-format and mismatched (--steps, --height, another model) checkpoints
                  are refused with messages that name the difference; options not given come from the checkpoint.
  layout          h5py reads a checkpoint without diffpipe and finds the layout docs/checkpoints.md documents; h5dump too;
                  `diffpipe inspect --checkpoint` prints it.
  embeddings      --embeddings-cache: a cold run and a warm run give latents bit-identical to a run without it,
                  and the warm run does not run CLIP or T5; a cache written before the format attribute is still
                  taken as a cache.
  shared-dir      a reused --checkpoint-dir (issue 21, case 1): run A leaves checkpoints; run B into the same
                  folder is refused, then with --share-checkpoint-dir is stopped by a signal; A's files are intact,
                  B's rotation removed only B's; --resume DIR with B's prompt resumes B (bit-identical to an
                  uninterrupted B), and without options names both runs and refuses.
  extras          a run with a LoRA adapter (unfused), true CFG (--negative-prompt, --true-cfg-scale) and --sigmas
                  stopped by SIGUSR1 writes a format-3 checkpoint holding them (h5py), resumes from --resume alone
                  (the adapter reopened from the path it records) bit-identical to the uninterrupted run, and a
                  resume with another --true-cfg-scale, --sigmas or adapter scale is refused naming the option;
                  inspect --checkpoint shows those options.
  last-image      PNG output stopped by SIGUSR1 at the boundary after the last step (--at last): exit 75, and every
                  image is written (the last one decodes after the blocks are freed), byte for byte as uninterrupted;
                  on several ranks with the VAE on rank 1, whose last images rank 0 waits for (it used to end without
                  them, and rank 1 waited out --transport-timeout sending them).

Needs DIFFPIPE_BINARY and h5py/numpy (the pinned venv)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from mpi_case import fail, mpirun, run, run_case  # noqa: E402
from mpi_generate_test import (PROMPTS, generate_args, latents, rank_pids, tiny_block_map,  # noqa: E402
                               write_tiny_lora)

STEPS = 4
EXIT_STOPPED = 75
STEP_OF = {"first": 1, "middle": 2, "last": STEPS}


def step_file(ckdir, k):
    """The checkpoint of step k in ckdir (checkpoint-stepNNNNNN-RUNID.h5), or None."""
    found = sorted(ckdir.glob(f"checkpoint-step{k:06d}-*.h5"))
    return found[0] if len(found) == 1 else None


def step_of(name):
    return int(name[len("checkpoint-step"):len("checkpoint-step") + 6])


def launcher(ranks):
    return mpirun(ranks) if ranks > 1 else []


def args_for(model, out, extra=()):
    return generate_args(model, out, ["--steps", str(STEPS)] + list(extra))


def reference(binary, model, tmp):
    out = tmp / "reference.h5"
    if not out.exists():
        code, output, _ = run([binary] + args_for(model, out))
        if code != 0:
            fail(f"the uninterrupted run exited {code}:\n{output}")
    return latents(out)


def run_until_held(command, env, on_hold, what):
    """Starts `command`, waits for the hold hook's line, calls on_hold(process), returns (code, output)."""
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output, held = [], False
    deadline = time.monotonic() + 300
    for line in job.stdout:
        output.append(line)
        if not held and "test hook: holding at step" in line:
            held = True
            on_hold(job)
        if time.monotonic() > deadline:
            job.kill()
            fail(f"{what}: no end within 300 s:\n{''.join(output)}")
    code = job.wait(timeout=120)
    if not held:
        fail(f"{what}: the run never reached the hold (exit {code}):\n{''.join(output)}")
    return code, "".join(output)


def resume_and_compare(binary, model, tmp, resume_from, ranks, expected, what, extra=(), tolerance=None):
    out = tmp / f"resumed-{what.replace(' ', '-')}.h5"
    # Only --model, --resume and --out: every other option comes from the checkpoint.
    command = launcher(ranks) + [binary, "generate", "--model", str(model), "--resume", str(resume_from),
                                 "--output-type", "latent", "--out", str(out)] + list(extra)
    code, output, _ = run(command)
    if code != 0:
        fail(f"{what}: --resume exited {code}:\n{output}")
    if "no text encoder runs" not in output:
        fail(f"{what}: the resume did not say it skipped the text encoders:\n{output}")
    got = latents(out)
    if tolerance is not None and got.shape == expected.shape:
        error = float(np.abs(got - expected).max()) / float(np.abs(expected).max())
        if not error <= tolerance:
            fail(f"{what}: resumed latents differ from the uninterrupted run by {error:.3g} of the scale")
        print(f"{what}: resumed on {ranks} rank(s) {' '.join(extra)}, "
              f"{'bit-identical to' if error == 0 else f'within {error:.3g} of'} the uninterrupted run's scale")
        return
    if got.shape != expected.shape or not np.array_equal(got, expected):
        diff = np.abs(got - expected).max() if got.shape == expected.shape else got.shape
        fail(f"{what}: resumed latents differ from the uninterrupted run: {diff}")
    print(f"{what}: resumed on {ranks} rank(s), bit-identical to the uninterrupted run")


def stop_by_signal(binary, model, tmp, ranks, k, sig, target):
    expected = reference(binary, model, tmp)
    ckdir = tmp / f"ck-{sig}-{target}-{k}"
    out = tmp / "stopped.h5"
    env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP=str(k))
    command = launcher(ranks) + [binary] + args_for(model, out, ["--checkpoint-dir", str(ckdir)])

    def send(job):
        if target == "every-rank-twice":
            # What SLURM does with `scancel --signal=USR1 --batch` and a batch shell that forwards it: srun gets
            # the signal twice and passes both copies to every task.
            pids = [pid for rank in range(ranks) for pid in rank_pids(rank, str(ckdir))] if ranks > 1 else [job.pid]
            if len(pids) < ranks:
                job.kill()
                fail(f"found {len(pids)} rank process(es) of {ranks}")
            for _ in range(2):
                for pid in pids:
                    os.kill(pid, sig)
                time.sleep(0.05)
        elif target in ("rank0", "worker") and ranks > 1:
            rank = 0 if target == "rank0" else ranks - 1
            pids = rank_pids(rank, str(ckdir))
            if not pids:
                job.kill()
                fail(f"could not find rank {rank}'s process")
            for pid in pids:
                os.kill(pid, sig)
        else:
            job.send_signal(sig)  # mpirun forwards it to every rank

    what = f"{signal.Signals(sig).name} to {target} at step {k} of {STEPS} on {ranks} rank(s)"
    code, output = run_until_held(command, env, send, what)
    if code != EXIT_STOPPED:
        fail(f"{what}: exit {code}, expected {EXIT_STOPPED}:\n{output}")
    if out.exists():
        fail(f"{what}: a stopped run wrote its output")
    names = sorted(p.name for p in ckdir.glob("checkpoint-step*.h5"))
    found = step_file(ckdir, k)
    if found is None:
        fail(f"{what}: no checkpoint of step {k} (found {names}):\n{output}")
    with h5py.File(found, "r") as f:
        steps = np.asarray(f["image_steps"])
        if steps.min() != k:
            fail(f"{what}: the checkpoint's slowest image is at step {steps.min()}, expected {k}")
    print(f"{what}: exit {EXIT_STOPPED}, checkpoint at steps {steps.tolist()}")
    resume_and_compare(binary, model, tmp, ckdir, ranks, expected, what)
    return ckdir, expected


def case_signal(binary, model, tmp, ranks, at):
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGUSR1, "launcher")


def case_signal_rank0(binary, model, tmp, ranks, at):
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGUSR1, "rank0")


def case_signal_worker(binary, model, tmp, ranks, at):
    if ranks < 2:
        fail("signal-worker needs several ranks")
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGTERM, "worker")
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGUSR1, "worker")


def case_signal_twice(binary, model, tmp, ranks, at):
    """Two copies of SIGUSR1 to every rank, 50 ms apart: one stop request, not a kill."""
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGUSR1, "every-rank-twice")


def case_sigterm(binary, model, tmp, ranks, at):
    stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGTERM, "launcher")


def case_killed(binary, model, tmp, ranks, at):
    k = STEP_OF[at]
    expected = reference(binary, model, tmp)
    ckdir = tmp / "ck-killed"
    env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP=str(k))
    victim = ranks - 1
    command = launcher(ranks) + [binary] + args_for(model, tmp / "killed.h5", [
        "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1", "--keep-checkpoints", "2",
        "--transport-timeout", "20"])

    def kill(job):
        if ranks == 1:
            job.send_signal(signal.SIGKILL)
            return
        pids = rank_pids(victim, str(ckdir))
        if not pids:
            job.kill()
            fail(f"could not find rank {victim}'s process")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    what = f"rank {victim} killed at step {k} of {STEPS} on {ranks} rank(s)"
    code, output = run_until_held(command, env, kill, what)
    if code in (0, EXIT_STOPPED):
        fail(f"{what}: exit {code}:\n{output}")
    names = sorted(p.name for p in ckdir.glob("checkpoint-step*.h5"))
    # --checkpoint-every 1 wrote steps 1..k (the last step is not checkpointed: the run finishes it), kept 2.
    # mpirun ends the other ranks of a job that lost one with SIGTERM, on which rank 0 checkpoints the state it
    # holds (step k) if it can: the newest is then step k itself.
    newest = {min(k, STEPS - 1), k}
    if not names or step_of(names[-1]) not in newest or len(names) > 2:
        fail(f"{what}: checkpoints {names}, expected the newest two, the newest one of {sorted(newest)}:\n{output}")
    print(f"{what}: exit {code}; checkpoints left {names}")
    resume_and_compare(binary, model, tmp, ckdir, ranks, expected, what)


def case_world_size(binary, model, tmp, ranks, at):
    ckdir, expected = stop_by_signal(binary, model, tmp, ranks, STEP_OF[at], signal.SIGUSR1, "launcher")
    for other in (1, 2):
        if other != ranks:
            resume_and_compare(binary, model, tmp, ckdir, other, expected,
                               f"checkpoint of {ranks} ranks resumed on {other}")


def case_mesh(binary, model, tmp, ranks, at):
    k = STEP_OF[at]
    expected = reference(binary, model, tmp)
    mesh = ["--sequence-parallel", "2"]
    for writer, reader in ((4, 1), (1, 4)):
        ckdir = tmp / f"ck-mesh-{writer}"
        env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP=str(k))
        command = launcher(writer) + [binary] + args_for(model, tmp / "stopped.h5", ["--checkpoint-dir", str(ckdir)] +
                                                         (mesh if writer == 4 else []))
        what = f"SIGUSR1 at step {k} on {'a 2 x 2 mesh' if writer == 4 else '1 rank'}"
        code, output = run_until_held(command, env, lambda job: job.send_signal(signal.SIGUSR1), what)
        if code != EXIT_STOPPED or step_file(ckdir, k) is None:
            fail(f"{what}: exit {code}, checkpoints {sorted(p.name for p in ckdir.glob('*.h5'))}:\n{output}")
        resume_and_compare(binary, model, tmp, ckdir, reader, expected, f"checkpoint of {what}",
                           mesh if reader == 4 else [], tolerance=1e-6)


def expect_refused(binary, command, what, must_contain):
    code, output, _ = run([binary] + command)
    if code == 0 or code == EXIT_STOPPED:
        fail(f"{what}: exited {code}:\n{output}")
    for text in must_contain:
        if text not in output:
            fail(f"{what}: the message does not contain '{text}':\n{output}")
    print(f"{what}: refused (exit {code}), names {must_contain}")


def one_checkpoint(binary, model, tmp, k=2):
    ckdir = tmp / "ck-one"
    if not ckdir.exists():
        code, output, _ = run([binary] + args_for(model, tmp / "one.h5", [
            "--checkpoint-dir", str(ckdir), "--checkpoint-every", str(k), "--keep-checkpoints", "1"]))
        if code != 0:
            fail(f"a run with --checkpoint-every {k} exited {code}:\n{output}")
    return step_file(ckdir, k)


def case_refused(binary, model, tmp, ranks, at):
    good = one_checkpoint(binary, model, tmp)
    resume = ["generate", "--model", str(model), "--output-type", "latent", "--out", str(tmp / "r.h5"), "--resume"]
    data = good.read_bytes()
    truncated = tmp / "truncated.h5"
    truncated.write_bytes(data[: len(data) // 2])
    expect_refused(binary, resume + [str(truncated)], "a truncated checkpoint", ["truncated.h5", "--resume"])
    corrupt = tmp / "corrupt.h5"
    shutil.copy(good, corrupt)
    with h5py.File(corrupt, "r") as f:
        offset = f["latents"].id.get_offset()
    blob = bytearray(corrupt.read_bytes())
    blob[offset + 100] ^= 0x10
    corrupt.write_bytes(bytes(blob))
    expect_refused(binary, resume + [str(corrupt)], "a corrupt checkpoint", ["corrupt.h5", "content digest mismatch"])
    newer = tmp / "newer.h5"
    shutil.copy(good, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["format_version"] = 99.0
    expect_refused(binary, resume + [str(newer)], "a checkpoint of a newer format",
                   ["format version 99", "newer diffpipe"])
    expect_refused(binary, resume + [str(good), "--steps", "5"], "--steps other than the checkpoint's",
                   ["--steps: checkpoint 4, this run 5"])
    expect_refused(binary, resume + [str(good), "--height", "128"], "--height other than the checkpoint's",
                   ["--height: checkpoint 64, this run 128"])
    expect_refused(binary, resume + [str(good), "--prompt", "another prompt"], "other prompts",
                   ["--prompts: checkpoint"])
    other = tmp / "other-model"
    code, output, _ = run([binary, "make-tiny", "--out", str(other), "--dtype", "fp16"])
    if code != 0:
        fail(f"make-tiny --dtype fp16 exited {code}:\n{output}")
    expect_refused(binary, ["generate", "--model", str(other), "--output-type", "latent", "--out",
                            str(tmp / "r.h5"), "--resume", str(good)], "another model",
                   ["was written for another model", "transformer fingerprint"])
    empty = tmp / "empty-dir"
    empty.mkdir()
    expect_refused(binary, resume + [str(empty)], "a directory without checkpoints", ["no valid checkpoint"])
    # The options given that match are fine, and the ones left out come from the checkpoint.
    expected = reference(binary, model, tmp)
    resume_and_compare(binary, model, tmp, good, 1, expected, "resume giving matching --steps and --seed",
                       ["--steps", str(STEPS), "--seed", "7"])


def case_layout(binary, model, tmp, ranks, at):
    path = one_checkpoint(binary, model, tmp)
    with h5py.File(path, "r") as f:
        datasets = {name: f[name] for name in f}
        expected = {"latents", "image_steps", "sigmas", "timesteps", "prompts", "prompt_embeds", "pooled_prompt_embeds"}
        if set(datasets) != expected:
            fail(f"datasets {sorted(datasets)}, documented {sorted(expected)}")
        images = len(PROMPTS) * 2
        checks = [
            (f["latents"].shape[0] == images and f["latents"].ndim == 3, "latents (B, seq, C)"),
            (f["latents"].dtype == np.float32 and f["latents"].attrs["dtype"] == b"fp32", "latents fp32 in an fp32 run"),
            # Microbatches enter a window one ring's depth at a time, so at the slowest image's step 2 the images
            # that entered first are further on (one rank: each microbatch runs to the end before the next).
            (min(f["image_steps"][...]) == 2 and all(2 <= s <= STEPS for s in f["image_steps"][...]),
             "image_steps: the slowest at 2, none past the last step"),
            (f["sigmas"].shape == (STEPS + 1,) and f["timesteps"].shape == (STEPS,), "the schedule's lengths"),
            ([p.decode() for p in f["prompts"][...]] == PROMPTS, "the prompts"),
            (f["prompt_embeds"].shape[:2] == (images, 32), "prompt_embeds (B, max_sequence_length, D)"),
            (f["pooled_prompt_embeds"].shape[0] == images, "pooled_prompt_embeds (B, D)"),
            (f.attrs["format"] == b"diffpipe-checkpoint" and f.attrs["format_version"] == 2, "format and version"),
            (len(f.attrs["run_id"]) == 16 and path.name.endswith(f"-{f.attrs['run_id'].decode()}.h5"),
             "the run id, also in the file name"),
            (len(f.attrs["request_fingerprint"]) == 16, "the request fingerprint"),
            (f.attrs["steps"] == STEPS and f.attrs["height"] == 64 and f.attrs["width"] == 96, "steps, height, width"),
            (f.attrs["seed"] == b"7" and f.attrs["dtype"] == b"fp32" and f.attrs["guidance"] == 3.5, "seed, dtype, guidance"),
            (f.attrs["world_size"] == 1 and len(f.attrs["model_fingerprint"]) > 0, "world size and model fingerprint"),
            (len(f.attrs["device_map"]) > 0 and len(f.attrs["content_digest"]) == 16, "device map and digest"),
        ]
        for ok, what in checks:
            if not ok:
                fail(f"h5py: {what} not as documented")
        steps_per_image = list(f["image_steps"][...])
    print(f"h5py: {path.name} has the documented layout")
    code, output, _ = run(["h5dump", "-H", str(path)])
    if code != 0 or 'DATASET "latents"' not in output:
        fail(f"h5dump -H exited {code}:\n{output[:2000]}")
    code, output, _ = run([binary, "inspect", "--checkpoint", str(path)])
    per_prompt = [f"steps done per image: {steps_per_image[2 * p]} {steps_per_image[2 * p + 1]}" for p in range(len(PROMPTS))]
    for text in ["2/4 steps done", PROMPTS[0], "--seed 7", "fingerprint"] + per_prompt:
        if code != 0 or text not in output:
            fail(f"inspect --checkpoint (exit {code}) does not print '{text}':\n{output}")
    print("h5dump and `diffpipe inspect --checkpoint` read it")


def case_embeddings(binary, model, tmp, ranks, at):
    expected = reference(binary, model, tmp)
    cache = tmp / "embeddings.h5"
    # "T5 forward" is the encode stage's own log line: the cold run must have it, the warm one must not.
    for run_name, must, must_not in (("cold", "T5 forward", "CLIP and T5 not run"),
                                     ("warm", "CLIP and T5 not run", "T5 forward")):
        out = tmp / f"{run_name}.h5"
        code, output, _ = run(launcher(ranks) + [binary] + args_for(model, out, ["--embeddings-cache", str(cache)]))
        if code != 0:
            fail(f"{run_name} cache run exited {code}:\n{output}")
        if must not in output or must_not in output:
            fail(f"{run_name} cache run: expected '{must}' and not '{must_not}' in the log:\n{output}")
        got = latents(out)
        if not np.array_equal(got, expected):
            fail(f"{run_name} cache run: latents differ from the run without a cache")
        print(f"embeddings cache, {run_name}: '{must}', latents bit-identical")
    # A cache an older diffpipe wrote (no format attribute, only /entries) is still recognised as a cache.
    with h5py.File(cache, "r+") as f:
        del f.attrs["format"]
    code, output, _ = run(launcher(ranks) + [binary] + args_for(model, tmp / "old-cache.h5", ["--embeddings-cache", str(cache)]))
    if code != 0 or "CLIP and T5 not run" not in output:
        fail(f"a cache without the format attribute was not taken as a cache (exit {code}):\n{output}")
    print("embeddings cache written before the format attribute: still a cache")


def case_shared_dir(binary, model, tmp, ranks, at):
    """Issue 21, case 1: run A (6 steps, every 2) and run B (other prompts, stopped at step 2) in one folder."""
    ckdir = tmp / "ck-shared"
    a_args = ["--prompt", "run A's prompt", "--steps", "6", "--checkpoint-dir", str(ckdir), "--checkpoint-every", "2"]
    code, output, _ = run([binary] + generate_args(model, tmp / "a.h5", a_args))
    if code != 0:
        fail(f"run A exited {code}:\n{output}")
    a_files = {p.name: p.read_bytes() for p in ckdir.glob("checkpoint-step*.h5")}
    if sorted(step_of(n) for n in a_files) != [2, 4]:
        fail(f"run A left {sorted(a_files)}, expected steps 2 and 4")
    b_prompts = ["--prompt", "run B's prompt"]
    b_opts = b_prompts + ["--steps", "5", "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1", "--keep-checkpoints", "1"]
    # generate_args adds PROMPTS after each run's own first prompt: A's and B's prompt lists differ in the first.
    code, output, _ = run([binary] + generate_args(model, tmp / "b.h5", b_opts))
    if code == 0 or "holds checkpoints of another run" not in output or "--share-checkpoint-dir" not in output:
        fail(f"run B into run A's folder: exit {code}, expected a refusal naming run A:\n{output}")
    print("run B into run A's checkpoint folder: refused, naming run A and --share-checkpoint-dir")
    expected_b = tmp / "b-reference.h5"
    code, output, _ = run([binary] + generate_args(model, expected_b, b_prompts + ["--steps", "5"]))
    if code != 0:
        fail(f"uninterrupted run B exited {code}:\n{output}")
    env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP="3")
    command = launcher(ranks) + [binary] + generate_args(model, tmp / "b.h5", b_opts) + ["--share-checkpoint-dir"]
    code, output = run_until_held(command, env, lambda job: job.send_signal(signal.SIGUSR1), "run B sharing the folder")
    if code != EXIT_STOPPED:
        fail(f"run B stopped by SIGUSR1: exit {code}:\n{output}")
    now = {p.name: p.read_bytes() for p in ckdir.glob("checkpoint-step*.h5")}
    for name, data in a_files.items():
        if now.get(name) != data:
            fail(f"run B changed or removed run A's {name}")
    b_files = sorted(set(now) - set(a_files))
    removed = [line for line in output.splitlines() if "checkpoint rotation: removed" in line]
    if [step_of(n) for n in b_files] != [3] or len(removed) != 2:
        fail(f"run B kept {b_files} and logged {len(removed)} removal(s); expected its step 3 only, 2 removals:\n{output}")
    print(f"run B (shared folder, stopped at step 3): run A's files intact; B keeps {b_files[0]}; "
          f"{len(removed)} removals logged")
    resume = launcher(ranks) + [binary, "generate", "--model", str(model), "--resume", str(ckdir), "--output-type",
                                "latent", "--out", str(tmp / "r.h5")]
    code, output, _ = run(resume)
    if code == 0 or "holds checkpoints of 2 runs that this request matches" not in output \
            or "run A's prompt" not in output or "run B's prompt" not in output:
        fail(f"--resume DIR without options: exit {code}, expected a refusal naming both runs:\n{output}")
    print("--resume DIR without options: refused, naming both runs")
    b_all_prompts = ["--prompt", "run B's prompt"] + [w for p in PROMPTS for w in ("--prompt", p)]
    code, output, _ = run(resume[:-4] + b_all_prompts + ["--output-type", "latent", "--out", str(tmp / "r.h5")])
    if code != 0 or b_files[0] not in output:
        fail(f"--resume DIR with B's prompt: exit {code}, expected B's checkpoint:\n{output}")
    if not np.array_equal(latents(tmp / "r.h5"), latents(expected_b)):
        fail("run B resumed from the shared folder differs from an uninterrupted run B")
    print("--resume DIR --prompt B: resumed run B, bit-identical to an uninterrupted run B")


def case_extras(binary, model, tmp, ranks, at):
    lora = tmp / "style.safetensors"
    write_tiny_lora(model, lora)
    extras = ["--lora", f"style={lora}:0.8", "--lora-mode", "unfused", "--negative-prompt", "blurry, dull",
              "--true-cfg-scale", "2", "--sigmas", "1.0,0.7,0.4,0.15"]
    out = tmp / "extras-reference.h5"
    code, output, _ = run(launcher(ranks) + [binary] + args_for(model, out, extras))
    if code != 0:
        fail(f"the uninterrupted run with LoRA, true CFG and sigmas exited {code}:\n{output}")
    expected = latents(out)
    plain = reference(binary, model, tmp)
    if np.abs(expected - plain).max() < 1e-3 * np.abs(plain).max():
        fail("LoRA, true CFG and sigmas did not change the latents")
    k = STEP_OF[at]
    ckdir = tmp / "ck-extras"
    env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP=str(k))
    command = launcher(ranks) + [binary] + args_for(model, tmp / "stopped.h5", extras + ["--checkpoint-dir", str(ckdir)])
    code, output = run_until_held(command, env, lambda job: job.send_signal(signal.SIGUSR1), "extras stopped")
    if code != EXIT_STOPPED:
        fail(f"extras: exit {code}, expected {EXIT_STOPPED}:\n{output}")
    path = step_file(ckdir, k)
    if path is None:
        fail(f"extras: no checkpoint of step {k} in {sorted(p.name for p in ckdir.glob('*.h5'))}")
    with h5py.File(path, "r") as f:
        checks = [
            (f.attrs["format_version"] == 3, "format version 3"),
            ([p.decode() for p in f["negative_prompts"][...]] == ["blurry, dull"], "negative prompts"),
            (f.attrs["true_cfg_scale"] == 2.0, "true_cfg_scale"),
            (list(f["custom_sigmas"][...]) == [1.0, 0.7, 0.4, 0.15], "custom sigmas"),
            (f["negative_prompt_embeds"].shape == f["prompt_embeds"].shape, "negative prompt embeddings"),
            (b"style" in f.attrs["lora"] and b"unfused" in f.attrs["lora"], "the adapter record"),
        ]
        for ok, what in checks:
            if not ok:
                fail(f"extras checkpoint: {what} not as documented")
    print(f"extras: stopped at step {k} on {ranks} rank(s); the format-3 checkpoint holds adapter, CFG and sigmas")
    code, shown, _ = run([binary, "inspect", "--checkpoint", str(path)])
    for text in ("--true-cfg-scale 2 --sigmas 1,0.7,0.4,0.15", 'negative prompt 0: "blurry, dull"',
                 "adapters (--lora): ", "style"):
        if code != 0 or text not in shown:
            fail(f"extras: inspect --checkpoint (exit {code}) does not show '{text}':\n{shown}")
    code, shown, _ = run([binary, "inspect", "--checkpoint", str(path), "--json"])
    options = json.loads(shown)["options"] if code == 0 else {}
    if (options.get("negative_prompts") != ["blurry, dull"] or options.get("true_cfg_scale") != 2.0
            or options.get("sigmas") != [1.0, 0.7, 0.4, 0.15] or "style" not in json.dumps(options.get("lora"))):
        fail(f"extras: inspect --checkpoint --json (exit {code}) lacks the format-3 options:\n{shown}")
    resume_and_compare(binary, model, tmp, ckdir, ranks, expected, "extras resumed from --resume alone")
    resume = ["generate", "--model", str(model), "--output-type", "latent", "--out", str(tmp / "r.h5"),
              "--resume", str(path)]
    expect_refused(binary, resume + ["--true-cfg-scale", "3"], "another --true-cfg-scale",
                   ["--true-cfg-scale: checkpoint 2"])
    expect_refused(binary, resume + ["--sigmas", "1.0,0.6,0.3,0.1"], "other --sigmas", ["--sigmas: checkpoint"])
    expect_refused(binary, resume + ["--lora", f"style={lora}:0.5", "--lora-mode", "unfused"],
                   "another adapter scale", ["--lora: checkpoint"])


def case_last_image(binary, model, tmp, ranks, at):
    # Stopped at the boundary after the last step: every microbatch has finished, and the last one, which is
    # decoded only once the blocks are freed, is still written, as the ones before it were. On several ranks the
    # VAE runs on rank 1, so rank 0 waits for the images that rank decodes after its ring.
    extra = ["--output-type", "png"]
    if ranks > 1:
        extra += ["--pipeline-device-map", "balanced", "--max-memory", "1=1GB",
                  "--device-map", str(tiny_block_map(tmp, ranks))]
    reference_png = tmp / "last-reference.png"
    code, output, _ = run(launcher(ranks) + [binary] + args_for(model, reference_png, extra))
    if code != 0:
        fail(f"last-image: the uninterrupted run exited {code}:\n{output}")
    out = tmp / "last-stopped.png"
    env = dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP=str(STEP_OF[at]))
    command = launcher(ranks) + [binary] + args_for(model, out, extra + ["--checkpoint-dir", str(tmp / "ck-last")])
    code, output = run_until_held(command, env, lambda job: job.send_signal(signal.SIGUSR1), "last-image")
    if code != EXIT_STOPPED:
        fail(f"last-image: exit {code}, expected {EXIT_STOPPED}:\n{output}")
    if ranks > 1 and "decoded on rank 1)" not in output:
        fail(f"last-image: the images were not decoded on rank 1:\n{output}")
    images = len(PROMPTS) * 2  # generate_args' --num-images-per-prompt 2
    for i in range(images):
        ours, theirs = out.with_name(f"{out.stem}-{i}.png"), reference_png.with_name(f"{reference_png.stem}-{i}.png")
        if not ours.exists() or ours.read_bytes() != theirs.read_bytes():
            fail(f"last-image: {ours.name} is missing or differs from the uninterrupted run's after a stop at step "
                 f"{STEP_OF[at]}:\n{output}")
    print(f"last-image: stopped at step {STEP_OF[at]} of {STEPS} on {ranks} rank(s) (exit {code}); all {images} "
          "images written, byte for byte the uninterrupted run's")


CASES = {"signal": case_signal, "signal-rank0": case_signal_rank0, "signal-worker": case_signal_worker,
         "signal-twice": case_signal_twice,
         "sigterm": case_sigterm, "killed": case_killed, "world-size": case_world_size, "mesh": case_mesh,
         "refused": case_refused, "layout": case_layout, "embeddings": case_embeddings, "shared-dir": case_shared_dir,
         "extras": case_extras, "last-image": case_last_image}


def add_step_option(parser):
    parser.add_argument("--at", choices=sorted(STEP_OF), default="middle")


if __name__ == "__main__":
    run_case(CASES, "diffpipe-checkpoint", default_ranks=1, mpirun_for_one_rank=False, add_options=add_step_option,
             case_args=lambda args: (args.ranks, args.at))
