"""File-system fuzz of `diffpipe generate` (issue 21): random combinations of output, input, cache and checkpoint
paths over a folder that holds a bit of everything (regular files, a prompts file, a checkpoint and a folder of
another run's checkpoints, an embeddings cache, latents, links to files, folders and nowhere, a hard link, a FIFO,
a read-only file system and a full one), at 1 and 2 ranks (mpirun --oversubscribe).

    fs_fuzz_test.py [--seed S] [--trials N] [--only K] [--budget SECONDS]

Invariant, after every run:
  - no file that was there before and that the run was not told to replace has changed (content, inode, type,
    link target), in the trial's folder or the model folder; nothing is left behind (.partial, .probe);
  - the run ended within its bound, and either exited non-zero or produced every output it was asked for.
"Told to replace": the --out files (PATH-i.png when several images), --report-json, the --report files, the
--embeddings-cache when it is a cache, and a resumed run's own older checkpoints (rotation).

Seeded and reproducible: trial K of seed S is always the same request on the same folder (--only K reruns it).
Bounded: N trials (default 40, one in three on 2 ranks), each with a time limit, and no new trial after --budget
seconds (default 150; the number run is printed). Runs inside a private mount namespace (unshare -m, root) so
that the tmpfs mounts (read-only, full) vanish with it; where that is not allowed, a file size limit (ulimit -f)
stands in for the full file system and the read-only case is left out, both said in the output.
Needs DIFFPIPE_BINARY and mpirun."""
import argparse
import hashlib
import os
import pathlib
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

from mpi_case import diffpipe_binary, fail, require_mpirun

STEPS = "1"
RUN_LIMIT = 90  # seconds a trial may take


def run(command, timeout, limit_file_size=False, env=None):
    def limit():
        if limit_file_size:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))
    started = time.monotonic()
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, preexec_fn=limit, env=env)
        return result.returncode, result.stdout + result.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
        return None, out, time.monotonic() - started


def mount_tmpfs(path, options):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


def snapshot(root):
    """Every entry under root, links not followed: what it is, and for files their content and inode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = pathlib.Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                out[str(path)] = ("file", hashlib.sha1(path.read_bytes()).hexdigest(), st.st_ino)
            elif stat.S_ISDIR(st.st_mode):
                out[str(path)] = ("dir",)
            else:
                out[str(path)] = ("special", stat.S_IFMT(st.st_mode))
    return out


class World:
    """The trial's folder. Names are relative to it; `kinds` says what each is, for the request picker."""

    def __init__(self, root, fixtures, can_mount):
        self.root = root
        root.mkdir()
        (root / "a.txt").write_text("some notes\n")
        (root / "b.png").write_bytes(b"\x89PNG not really")
        (root / "prompts.txt").write_text("a red fox\n")
        (root / "bad-prompts.txt").write_bytes(b"\xff\xfe broken utf-8\n")
        (root / "config.json").write_text('{"steps": 1, "height": 32, "width": 32}\n')
        shutil.copy(fixtures / "latents.h5", root / "latents.h5")
        shutil.copy(fixtures / "cache.h5", root / "cache.h5")
        shutil.copy(fixtures / "checkpoint.h5", root / "checkpoint.h5")
        shutil.copytree(fixtures / "ck-other", root / "ck-other")
        shutil.copytree(fixtures / "ck-run", root / "ck-run")
        (root / "sub").mkdir()
        (root / "sub" / "kept.txt").write_text("kept")
        os.symlink("a.txt", root / "link-a.png")
        os.symlink("cache.h5", root / "link-cache.h5")
        os.symlink("nowhere/at/all.png", root / "dangling.png")
        os.symlink("sub", root / "link-sub")
        os.link(root / "a.txt", root / "hard-a.png")
        os.mkfifo(root / "fifo.png")
        os.symlink(root / "a.txt", root / "ck-other" / fixtures.joinpath("planted-name").read_text())
        self.read_only = self.full = False
        if can_mount:
            (root / "ro").mkdir()
            if mount_tmpfs(root / "ro", "size=1m"):
                (root / "ro" / "old.png").write_bytes(b"read-only data")
                self.read_only = subprocess.run(["mount", "-o", "remount,ro", str(root / "ro")]).returncode == 0
            (root / "full").mkdir()
            if mount_tmpfs(root / "full", "size=64k"):
                (root / "full" / "old.txt").write_text("before the disk filled up")
                try:
                    with open(root / "full" / "filler", "wb") as f:
                        while True:
                            f.write(b"\0" * 4096)
                            f.flush()
                except OSError:
                    pass  # ENOSPC: full to the last block
                self.full = True

    def unmount(self):
        unmount_under(self.root)


def unmount_under(root):
    """Unmounts every file system mounted under root (deepest first)."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    prefix = str(root) + "/"
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def pick_output(rng, world, ext):
    """A path for an output: about half of the time one that can be written (new, or a file to replace), else
    one that must be refused or that collides."""
    n = rng.randrange(100)
    good = [f"new{n}.{ext}", f"new{n}.{ext}", f"sub/new{n}.{ext}", f"link-sub/new{n}.{ext}",
            "b.png" if ext == "png" else "latents.h5", "/dev/null", f"ck-run/x{n}.{ext}"]
    bad = [f"missing/x.{ext}", "link-a.png", "dangling.png", "hard-a.png", "fifo.png", "sub", "prompts.txt",
           "cache.h5", "checkpoint.h5", "config.json", "MODEL/x.png", "a.txt"]
    if world.read_only:
        bad += [f"ro/new.{ext}", "ro/old.png"]
    if world.full:
        bad += [f"full/new.{ext}", "full/old.txt"]
    return rng.choice(good if rng.random() < 0.55 else bad)


def resolve(world, model, name):
    if name.startswith("/"):
        return name
    if name.startswith("MODEL/"):
        return str(model / name[len("MODEL/"):])
    return str(world.root / name)


def make_request(rng, world, model, ranks):
    """generate's arguments for one trial, and what the run is told to replace."""
    output_type = rng.choice(["png", "png", "latent"])
    ext = "png" if output_type == "png" else "h5"
    args = ["generate", "--model", str(model), "--output-type", output_type, "--height", "32", "--width", "32",
            "--max-sequence-length", "16", "--dtype", "fp32"]
    resume = rng.random() < 0.2
    images = 1
    prompts = 0
    if resume:
        target = rng.choice(["checkpoint.h5", "ck-run", "ck-other", "a.txt", "link-sub"])
        args += ["--resume", resolve(world, model, target)]
        images = 2  # the fixtures' checkpoints: 2 prompts x 1 image
    else:
        args += ["--steps", STEPS]
        with_file = rng.random() < 0.35
        if not with_file or rng.random() < 0.5:
            args += ["--prompt", "a cat"]
            prompts += 1
        if with_file:
            # Not the FIFO: an input FIFO is read as a pipe is (`--prompts-file <(...)`), waiting for its writer.
            name = rng.choice(["prompts.txt", "prompts.txt", "bad-prompts.txt", "sub", "a.txt", "link-a.png"])
            args += ["--prompts-file", resolve(world, model, name)]
            prompts += 1  # each of those holds one line (when readable)
        nipp = rng.choice([1, 1, 2])
        args += ["--num-images-per-prompt", str(nipp)]
        images = max(prompts, 1) * nipp
        if rng.random() < 0.15:
            args += ["--config", resolve(world, model, "config.json")]
    out = resolve(world, model, pick_output(rng, world, ext))
    args += ["--out", out]
    told = set()
    outputs = []
    if out == "/dev/null" or output_type == "latent":  # latents: one file for the whole batch
        outputs.append(out)
    elif images == 1:
        outputs.append(out)
    else:
        p = pathlib.Path(out)
        outputs += [str(p.parent / f"{p.stem}-{i}{p.suffix}") for i in range(images)]
    told.update(outputs)
    if rng.random() < 0.3:
        report_json = resolve(world, model, rng.choice(
            ["report.json", "report.json", "a.txt", "link-a.png", "fifo.png", "sub", "/dev/null", out] +
            (["full/r.json"] if world.full else [])))
        args += ["--report-json", report_json]
        told.add(report_json)
        outputs.append(report_json)
    if rng.random() < 0.25:
        report = resolve(world, model, rng.choice(["rank-report.json", "rank-report.json", "link-a.png", "missing/r.json",
                                                   "a.txt", out]))
        args += ["--report", report]
        files = [report] if ranks == 1 or report == "/dev/null" else [
            str(pathlib.Path(report).parent / f"{pathlib.Path(report).stem}.rank{r}{pathlib.Path(report).suffix}")
            for r in range(ranks)]
        told.update(files)
        outputs += files
    if rng.random() < 0.3:
        cache_name = rng.choice(["cache.h5", "new-cache.h5", "prompts.txt", "latents.h5", "link-cache.h5", "checkpoint.h5",
                                 "fifo.png", out] + (["full/cache.h5"] if world.full else []))
        cache = resolve(world, model, cache_name)
        args += ["--embeddings-cache", cache]
        if cache_name in ("cache.h5", "new-cache.h5") or cache_name == out:
            told.add(cache)
        # Not an output to expect: the cache is written only when prompts were encoded (not on a resume).
    if rng.random() < 0.35:
        ck_name = rng.choice(["ck-new", "ck-other", "ck-run", "sub", "a.txt", "link-sub", "MODEL"] +
                             (["ro/ck"] if world.read_only else []) + (["full/ck"] if world.full else []))
        args += ["--checkpoint-dir", resolve(world, model, ck_name), "--checkpoint-every", "1"]
        if rng.random() < 0.3:
            args += ["--share-checkpoint-dir"]
        if resume:
            # A resumed run continues its run id: its own older checkpoints in the folder may rotate away.
            told.update(str(p) for p in pathlib.Path(resolve(world, model, ck_name)).glob(f"*-{RESUMED_RUN}.h5"))
    return args, told, outputs


RESUMED_RUN = ""  # the run id of the fixtures' checkpoint.h5 and ck-run (set by make_fixtures)


def make_fixtures(binary, fixtures, model):
    """A model, latents, a cache, a checkpoint (run X) with a folder of its own, another run's folder."""
    global RESUMED_RUN
    fixtures.mkdir()
    base = [binary, "generate", "--model", str(model), "--height", "32", "--width", "32", "--max-sequence-length",
            "16", "--dtype", "fp32", "--prompt", "one", "--prompt", "two", "--output-type", "latent"]
    steps = [
        base + ["--steps", "1", "--out", str(fixtures / "latents.h5"), "--embeddings-cache", str(fixtures / "cache.h5")],
        base + ["--steps", "3", "--out", str(fixtures / "x.h5"), "--checkpoint-dir", str(fixtures / "ck-run"),
                "--checkpoint-every", "1", "--keep-checkpoints", "3"],
        base + ["--steps", "3", "--seed", "5", "--out", str(fixtures / "y.h5"), "--checkpoint-dir",
                str(fixtures / "ck-other"), "--checkpoint-every", "1"],
    ]
    for command in steps:
        code, output, _ = run(command, 300)
        if code != 0:
            fail(f"fixture run exited {code}:\n{output}")
    ours = sorted((fixtures / "ck-run").glob("checkpoint-step*.h5"))
    shutil.copy(ours[0], fixtures / "checkpoint.h5")
    RESUMED_RUN = ours[0].name.rsplit("-", 1)[1][:-3]
    # A link planted under a name the other run's rotation would use, pointing at a file of the trial's folder.
    other = sorted((fixtures / "ck-other").glob("checkpoint-step*.h5"))[0].name
    (fixtures / "planted-name").write_text(other.replace("step000001", "step000009"))


def check_trial(k, world, model, args, told, outputs, before_world, before_model, code, output, seconds):
    problems = []
    if code is None:
        problems.append(f"did not end within {RUN_LIMIT} s")
    after_world = snapshot(world.root)
    for path, what in before_world.items():
        if path in told:
            continue
        now = after_world.get(path)
        if now != what:
            problems.append(f"{path} changed: {what} -> {now}")
    after_model = snapshot(model)
    if after_model != before_model:
        problems.append("the model folder changed")
    for path in after_world:
        if path.endswith(".partial") or path.endswith(".probe"):
            problems.append(f"left behind: {path}")
    if not os.path.exists("/dev/null") or not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        problems.append("/dev/null is no longer a character device")
    if code == 0:
        for path in outputs:
            if path != "/dev/null" and not (os.path.isfile(path) and not os.path.islink(path)):
                problems.append(f"exit 0 but the output {path} is not a regular file")
    elif code is not None:
        errors = [line for line in output.splitlines() if "error" in line]
        if not errors:
            problems.append(f"exit {code} without an error line")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--only", type=int, default=None)
    parser.add_argument("--budget", type=float, default=150)
    parser.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    binary = diffpipe_binary()
    require_mpirun()
    if not args.in_namespace and os.geteuid() == 0 and shutil.which("unshare"):
        # Everything again inside a private mount namespace: its tmpfs mounts vanish with it.
        command = ["unshare", "-m", "--propagation", "private", sys.executable, __file__, "--in-namespace"] + sys.argv[1:]
        if subprocess.run(["unshare", "-m", "--propagation", "private", "true"]).returncode == 0:
            sys.exit(subprocess.run(command).returncode)
    can_mount = args.in_namespace
    print(f"seed {args.seed}; " + ("tmpfs mounts in a private mount namespace (read-only and full file systems)"
                                   if can_mount else "no mounts here: ulimit -f stands in for a full file system, "
                                   "no read-only file system"))
    rng_master = random.Random(args.seed)
    seeds = [rng_master.randrange(1 << 30) for _ in range(args.trials)]
    started = time.monotonic()
    failures, counts = [], {"ok": 0, "refused": 0}
    with tempfile.TemporaryDirectory(prefix="diffpipe-fsfuzz-") as tmp:
        tmp = pathlib.Path(tmp)
        model = tmp / "model"
        code, output, _ = run([binary, "make-tiny", "--out", str(model)], 300)
        if code != 0:
            fail(f"make-tiny exited {code}:\n{output}")
        make_fixtures(binary, tmp / "fixtures", model)
        trials = [args.only] if args.only is not None else range(args.trials)
        ran = 0
        for k in trials:
            if args.only is None and time.monotonic() - started > args.budget:
                print(f"time budget of {args.budget:.0f} s reached after {ran} trial(s)")
                break
            rng = random.Random(seeds[k])
            ranks = 2 if k % 3 == 2 else 1
            try:
                world = World(tmp / f"trial-{k}", tmp / "fixtures", can_mount)
                request, told, outputs = make_request(rng, world, model, ranks)
                limit_file_size = not can_mount and rng.random() < 0.15
                before_world, before_model = snapshot(world.root), snapshot(model)
                launcher = ["mpirun", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1"] if ranks == 2 else []
                env = dict(os.environ, OMP_NUM_THREADS="1")
                code, output, seconds = run(launcher + [binary] + request, RUN_LIMIT, limit_file_size, env)
                problems = check_trial(k, world, model, request, told, outputs, before_world, before_model, code,
                                       output, seconds)
            finally:
                unmount_under(tmp / f"trial-{k}")
            shown = " ".join(a.replace(str(world.root) + "/", "").replace(str(model), "MODEL") for a in request[3:])
            first_error = next((line for line in output.splitlines() if "error" in line), "")
            outcome = "ok" if code == 0 else f"exit {code}: {first_error[:150]}"
            print(f"trial {k} ({ranks} rank{'s' if ranks > 1 else ''}, {seconds:.1f} s){' [ulimit -f]' if limit_file_size else ''}: "
                  f"{shown}\n    -> {outcome}")
            counts["ok" if code == 0 else "refused"] += 1
            ran += 1
            if problems:
                failures.append((k, problems, output))
                print("    INVARIANT BROKEN:\n      " + "\n      ".join(problems))
    print(f"{ran} trial(s) in {time.monotonic() - started:.0f} s: {counts['ok']} produced every output, "
          f"{counts['refused']} exited non-zero")
    if failures:
        for k, problems, output in failures:
            print(f"--- trial {k} (rerun: fs_fuzz_test.py --seed {args.seed} --only {k}) output:\n{output[-3000:]}")
        fail(f"{len(failures)} trial(s) broke the invariant")
    if args.only is None and counts["ok"] == 0:
        fail("no trial produced its outputs: the fuzz only exercised refusals")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
