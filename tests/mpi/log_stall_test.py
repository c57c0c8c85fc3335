"""A rank's log never holds its compute (issue 21, case 6: a stopped mpirun held the job past the transport
timeout, because rank 0 blocked writing its log to it).

    log_stall_test.py CASE

Cases:
  pipe            one process whose stderr is a pipe nobody reads (shrunk to one page, so that a few lines fill
                  it): the run keeps going (its checkpoints, one a step, keep coming), and once the pipe is read
                  again the log says how many lines it dropped; exit 0, output written.
  mpirun-stopped  mpirun -np 2 is stopped with SIGSTOP mid-run (it no longer reads the ranks' output, so their
                  pipes fill): the ranks keep computing to the end of the denoising and write the latents; after
                  SIGCONT the job exits 0 and the log says how many lines were dropped.
Progress is read from the checkpoint folder (--checkpoint-every 1): its newest checkpoint's step. A run that
makes no progress for 30 s while its output is not read fails the test (the old, blocking log).
Needs DIFFPIPE_BINARY and mpirun."""
import fcntl
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from mpi_case import fail, mpirun, run_case  # noqa: E402
from mpi_generate_test import generate_args  # noqa: E402

F_SETPIPE_SZ = 1031
STALL_LIMIT = 30  # seconds without progress that count as "held"


def newest_step(ckdir):
    steps = [int(p.name[len("checkpoint-step"):len("checkpoint-step") + 6]) for p in ckdir.glob("checkpoint-step*.h5")]
    return max(steps, default=0)


def wait_for_progress(ckdir, target, job, what, done=None):
    """Waits until the newest checkpoint reaches `target` (or `done()` is true); fails when nothing moves for
    STALL_LIMIT seconds."""
    last, moved = newest_step(ckdir), time.monotonic()
    while newest_step(ckdir) < target and not (done and done()):
        if job.poll() is not None:
            return
        step = newest_step(ckdir)
        if step != last:
            last, moved = step, time.monotonic()
        if time.monotonic() - moved > STALL_LIMIT:
            job.kill()
            fail(f"{what}: no progress for {STALL_LIMIT} s at step {last} while the log was not read: the log "
                 "blocked the run")
        time.sleep(0.2)


def drain(stream, sink):
    for line in iter(stream.readline, b""):
        sink.append(line.decode(errors="replace"))


def case_pipe(binary, model, tmp):
    ckdir = tmp / "ck"
    steps = 60
    command = [binary] + generate_args(model, tmp / "out.h5", [
        "--steps", str(steps), "--height", "32", "--width", "32", "--num-images-per-prompt", "1",
        "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1", "--keep-checkpoints", "1"])
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=write_end)
    os.close(write_end)
    started = time.monotonic()
    # Nobody reads: a blocking log fills the page within a few steps and stops there.
    wait_for_progress(ckdir, steps * 2 // 3, job, "stderr a full pipe")
    stalled_for = time.monotonic() - started
    lines = []
    reader = threading.Thread(target=drain, args=(os.fdopen(read_end, "rb"), lines))
    reader.start()
    try:
        code = job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("the run did not end within 120 s once its log was read again")
    reader.join(timeout=10)
    log = "".join(lines)
    if code != 0 or not (tmp / "out.h5").exists():
        fail(f"exit {code} (output written: {(tmp / 'out.h5').exists()}):\n{log[-3000:]}")
    notices = [line for line in log.splitlines() if "log line(s) dropped: stderr took nothing" in line]
    if not notices:
        fail(f"the log never said how many lines it dropped:\n{log[-3000:]}")
    print(f"stderr a pipe nobody read for {stalled_for:.1f} s: the run went on to step {steps * 2 // 3}+; "
          f"then: {notices[0].split('] ', 3)[-1]}")


def case_mpirun_stopped(binary, model, tmp):
    ckdir = tmp / "ck"
    out = tmp / "out.h5"
    steps = 400
    command = mpirun(2) + [binary] + generate_args(model, out, [
        "--steps", str(steps), "--height", "32", "--width", "32", "--num-images-per-prompt", "1",
        "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1", "--keep-checkpoints", "1",
        "--transport-timeout", "20"])
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for raw in job.stdout:
        lines.append(raw.decode(errors="replace"))
        if "progress 3/" in lines[-1]:
            break
    else:
        fail(f"the job ended before step 3 (exit {job.wait()}):\n{''.join(lines)}")
    job.send_signal(signal.SIGSTOP)  # mpirun reads nothing now; the ranks' pipes to it fill up
    stopped_at = time.monotonic()
    try:
        # The denoising runs to its end and rank 0 writes the latents before MPI_Finalize (which waits for mpirun).
        wait_for_progress(ckdir, steps - 1, job, "mpirun stopped", done=out.exists)
        deadline = time.monotonic() + 60
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not out.exists():
            fail(f"mpirun stopped: the ranks reached step {newest_step(ckdir)} but wrote no output within 60 s")
        held = time.monotonic() - stopped_at
    finally:
        job.send_signal(signal.SIGCONT)
    rest = []
    reader = threading.Thread(target=drain, args=(job.stdout, rest))
    reader.start()
    try:
        code = job.wait(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("the job did not end within 120 s after SIGCONT")
    reader.join(timeout=10)
    log = "".join(lines + rest)
    if code != 0:
        fail(f"exit {code} after SIGCONT:\n{log[-4000:]}")
    notices = [line for line in log.splitlines() if "log line(s) dropped" in line]
    if not notices:
        fail(f"no rank said how many log lines it dropped:\n{log[-4000:]}")
    print(f"mpirun stopped for {held:.1f} s: the ranks finished all {steps} steps and wrote the latents; after "
          f"SIGCONT exit 0; {notices[0].split('] ', 3)[-1]}")


CASES = {"pipe": case_pipe, "mpirun-stopped": case_mpirun_stopped}


if __name__ == "__main__":
    run_case(CASES, "diffpipe-log-stall")
