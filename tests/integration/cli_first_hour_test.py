#!/usr/bin/env python3
"""What a new user meets first, run through the real binary: --version, the documented exit statuses (README's
"Exit status" table), diffusers' option names and "did you mean" for a misspelt option.

Usage: cli_first_hour_test.py CASE [CASE ...]   (cases: version, exit-codes, diffusers-names, did-you-mean, defaults, hub-id, logs, issue-bugs;
none: all). Needs DIFFPIPE_BINARY (the built diffpipe). Exits non-zero naming the first check that failed."""
import json
import os
import pathlib
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

BINARY = os.environ.get("DIFFPIPE_BINARY", "")
SMALL = ["--height", "32", "--width", "32", "--max-sequence-length", "16"]


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(args, env=None, timeout=300):
    result = subprocess.run([BINARY] + args, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, **(env or {})))
    return result.returncode, result.stdout, result.stderr


def expect_code(args, code, what, contains=None, env=None):
    got, out, err = run(args, env)
    if got != code:
        fail(f"{what}: `diffpipe {' '.join(args)}` exited {got}, the README says {code}:\n{out}\n{err}")
    if contains is not None and contains not in out + err:
        fail(f"{what}: the output does not say {contains!r}:\n{out}\n{err}")
    print(f"ok: {what}: exit {code}")
    return out + err


def tiny_model(tmp):
    folder = tmp / "tiny"
    if not folder.exists():
        code, out, err = run(["make-tiny", "--out", str(folder)])
        if code != 0:
            fail(f"make-tiny exited {code}:\n{out}\n{err}")
    return folder


def nan_model(tmp):
    """The tiny model with NaN in the transformer's proj_out.weight: it loads, then the first step fails."""
    folder = tmp / "nan"
    subprocess.run(["cp", "-r", str(tiny_model(tmp)), str(folder)], check=True)
    weights = next((folder / "transformer").glob("*.safetensors"))
    with open(weights, "r+b") as f:
        header_size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_size))
        entry = header["proj_out.weight"]
        begin, end = entry["data_offsets"]
        nan = {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}[entry["dtype"]]
        f.seek(8 + header_size + begin)
        f.write(nan * ((end - begin) // len(nan)))
    return folder


def case_version(tmp):
    for args in (["--version"], ["plan", "--version"]):
        out = expect_code(args, 0, f"diffpipe {' '.join(args)}")
        for field in ("diffpipe 0.", " git ", "LibTorch: ", "CUDA: ", "GPUs visible: ", "NCCL: ", "MPI: "):
            if field not in out:
                fail(f"diffpipe {' '.join(args)} does not print {field!r}:\n{out}")
    if "--version" not in run(["--help"])[1]:
        fail("diffpipe --help does not list --version")


def case_exit_codes(tmp):
    model = str(tiny_model(tmp))
    out = str(tmp / "x.png")
    expect_code(["--help"], 0, "help")
    expect_code(["generate", "--help"], 0, "generate --help")
    # 2: usage
    expect_code(["genrate"], 2, "unknown command")
    expect_code(["generate", "--prompt", "cat"], 2, "generate without --model", "--model")
    expect_code(["plan"], 2, "plan without --model", "--model")
    expect_code(["generate", "--model", model, "--prompt", "cat", "--no-such-flag"], 2, "unknown option")
    expect_code(["generate", "--model", model, "--steps", "many", "--prompt", "cat"], 2, "a value of the wrong type")
    expect_code(["generate", "--model", model, "--prompt", "a", "cat", "--out", out], 2, "an unquoted prompt")
    expect_code(["inspect", "--model", model, "--jsn"], 2, "unknown option of inspect")
    # 3: input, refused before any work
    expect_code(["generate", "--model", str(tmp / "missing"), "--prompt", "cat", "--out", out], 3,
                "a model folder that does not exist")
    expect_code(["generate", "--model", model, "--prompt", "cat", "--steps", "0", "--out", out], 3, "--steps 0")
    expect_code(["plan", "--model", str(tmp / "missing")], 3, "plan of a missing folder")
    expect_code(["inspect", "--checkpoint", str(tmp / "missing.h5")], 3, "inspect of a missing checkpoint")
    # 1: runtime, the work started and failed
    expect_code(["generate", "--model", str(nan_model(tmp)), "--prompt", "cat", "--steps", "2", "--out", out] + SMALL,
                1, "NaN weights found while denoising", "NaN")
    # make-tiny checks its folder (3), then a write that fails is a runtime error (1): here the folder
    # "transformer" it must create is taken by a file.
    blocked = tmp / "blocked"
    blocked.mkdir()
    (blocked / "transformer").write_text("not a folder")
    expect_code(["make-tiny", "--out", str(blocked)], 3, "make-tiny into a folder that is not empty")
    expect_code(["make-tiny", "--out", str(blocked), "--force"], 1, "make-tiny whose write fails")
    # 75: preempted after a checkpoint
    ckdir = tmp / "ck"
    command = [BINARY, "generate", "--model", model, "--prompt", "cat", "--steps", "4", "--checkpoint-dir", str(ckdir),
               "--output-type", "latent", "--out", str(tmp / "x.h5")] + SMALL
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, DIFFPIPE_TEST_HOLD_AT_STEP="2"))
    deadline, lines, held = time.monotonic() + 300, [], False
    for line in job.stdout:
        lines.append(line)
        if not held and "test hook: holding at step" in line:
            held = True
            job.send_signal(signal.SIGUSR1)
        if time.monotonic() > deadline:
            job.kill()
            fail("the stopped run did not end within 300 s:\n" + "".join(lines))
    code = job.wait(timeout=60)
    if not held or code != 75:
        fail(f"a run stopped by SIGUSR1 exited {code} (held: {held}), the README says 75:\n{''.join(lines)}")
    print("ok: stopped by SIGUSR1 after a checkpoint: exit 75")


def case_diffusers_names(tmp):
    model = str(tiny_model(tmp))
    ours = tmp / "ours.h5"
    theirs = tmp / "theirs.h5"
    common = ["generate", "--model", model, "--prompt", "a red cube", "--seed", "3", "--output-type", "latent"] + SMALL
    expect_code(common + ["--steps", "2", "--guidance", "2.5", "--dtype", "fp32", "--out", str(ours)], 0, "our names")
    expect_code(common + ["--num-inference-steps", "2", "--guidance-scale", "2.5", "--torch-dtype", "torch.float32",
                          "--out", str(theirs)], 0, "diffusers' names")
    import h5py
    import numpy as np
    with h5py.File(ours, "r") as a, h5py.File(theirs, "r") as b:
        same = np.array_equal(a["latents"][()], b["latents"][()]) and dict(a.attrs) == dict(b.attrs)
    if not same:
        fail("diffusers' names gave other latents or attributes than ours: an alias is not the same option")
    png = tmp / "pil.png"
    log = expect_code(["generate", "--model", model, "--prompt", "cat", "--steps", "1", "--output-type", "pil",
                       "--torch-dtype", "bfloat16", "--out", str(png)] + SMALL, 0, "--output-type pil")
    if not png.read_bytes().startswith(b"\x89PNG"):
        fail("--output-type pil did not write a PNG")
    if "bf16" not in log:
        fail(f"--torch-dtype bfloat16 is not reported as bf16:\n{log}")


def case_did_you_mean(tmp):
    model = str(tiny_model(tmp))
    for command, wrong, meant in (
            (["generate", "--model", model, "--prompt", "cat"], "--num-inference-step", "--num-inference-steps"),
            (["generate", "--model", model, "--prompt", "cat"], "--guidence", "--guidance"),
            (["plan", "--model", model], "--device_map", "--device-map"),
            (["inspect", "--model", model], "--jsno", "--json"),
            (["make-tiny", "--out", str(tmp / "t2")], "--attention-head", "--attention-heads")):
        args = command + [wrong, "1"] if wrong != "--jsno" else command + [wrong]
        out = expect_code(args, 2, f"{command[0]} {wrong}")
        hint = f"unknown option {wrong} (did you mean {meant}?)"
        if hint not in out:
            fail(f"`{' '.join(args)}` does not say {hint!r}:\n{out}")
    out = expect_code(["plan", "--model", model, "--zzzzzz"], 2, "an option far from every name")
    if "unknown option --zzzzzz" not in out or "did you mean" in out:
        fail(f"a far-off option should be named without a guess:\n{out}")


def case_defaults(tmp):
    model = str(tiny_model(tmp))
    # generate: --device auto, the dtype of the device it chose, the pipeline map, all said on the start line.
    log = expect_code(["generate", "--model", model, "--prompt", "cat", "--steps", "1", "--output-type", "latent",
                       "--out", str(tmp / "d.h5")] + SMALL, 0, "generate with the defaults")
    gpu = "GPUs visible: 0" not in run(["--version"])[1]
    device = "cuda" if gpu else "cpu"
    expected = f"{'bf16' if gpu else 'fp32'} on {device} (--device auto), device map pipeline (the default)"
    if expected not in log:
        fail(f"generate does not say the values it chose ({expected!r}):\n{log}")
    if "auto" not in run(["generate", "--help"])[1].split("--device ", 1)[1].split("\n", 1)[0]:
        fail("generate --help does not give --device's default as auto")
    # forward and calibrate: the same device rule, and the same dtype for the device chosen.
    for command in ("forward", "calibrate"):
        if "auto" not in run([command, "--help"])[1].split("--device ", 1)[1].split("\n", 1)[0]:
            fail(f"{command} --help does not give --device's default as auto")
    forward = expect_code(["forward", "--model", model, "--height", "32", "--width", "32", "--text-len", "8",
                           "--repeat", "1", "--warmup", "0"], 0, "forward with the defaults")
    if f"{'bf16' if gpu else 'fp32'} on {device}" not in forward:
        fail(f"forward does not run generate's default device and dtype ({device}):\n{forward}")
    # plan: generate's map by default, and generate's dtype rule for the device it plans.
    plan = json.loads(run(["plan", "--model", model, "--json"])[1])
    if plan["transformer"]["device_map"] != "pipeline" or plan["dtype"] != "bf16":
        fail(f"plan's defaults: map {plan['transformer']['device_map']}, dtype {plan['dtype']}; "
             "expected generate's: pipeline, bf16 on cuda")
    if json.loads(run(["plan", "--model", model, "--json", "--device", "cpu"])[1])["dtype"] != "fp32":
        fail("plan --device cpu does not plan fp32, generate's dtype on the CPU")
    text = run(["plan", "--model", model])[1]
    if "dtype bf16, the default for --device cuda" not in text:
        fail(f"plan does not say which dtype it chose and why:\n{text}")
    # The demo's plan table is of the dtype its runs use.
    demo = (pathlib.Path(__file__).resolve().parents[2] / "launch" / "demo.sh").read_text()
    plan_line = next(line for line in demo.splitlines() if line.startswith('"$bin" plan '))
    args = plan_line.replace('"$bin" plan ', "").replace('"$model"', model).split()
    shown = run(["plan"] + args)[1]
    dtype_lines = [line for line in shown.splitlines() if "dtype " in line]
    if not dtype_lines or "dtype fp32" not in dtype_lines[0] or demo.count("--dtype fp32") < 3:
        fail(f"the demo plans another dtype than it runs (fp32): {shown}")
    print("ok: generate and plan share their defaults and say them")


def png_size(path):
    data = pathlib.Path(path).read_bytes()
    width, height = struct.unpack(">II", data[16:24])  # IHDR, right after the signature and chunk header
    return height, width


def case_issue_bugs(tmp):
    model = str(tiny_model(tmp))
    # --report-json records the size of the image written, not the one asked for before rounding.
    png, report, ckdir = tmp / "r.png", tmp / "r.json", tmp / "ck-bugs"
    expect_code(["generate", "--model", model, "--prompt", "cat", "--steps", "3", "--height", "100", "--width", "130",
                 "--max-sequence-length", "16", "--out", str(png), "--report-json", str(report),
                 "--checkpoint-dir", str(ckdir), "--checkpoint-every", "1"], 0, "a size that is rounded")
    doc = json.loads(report.read_text())
    if (doc["height"], doc["width"]) != png_size(png) or (doc["requested_height"], doc["requested_width"]) != (100, 130):
        fail(f"--report-json says {doc['height']}x{doc['width']} (asked {doc.get('requested_height')}x"
             f"{doc.get('requested_width')}), the PNG is {png_size(png)}")
    # inspect --checkpoint takes the folder as --resume does.
    text = expect_code(["inspect", "--checkpoint", str(ckdir)], 0, "inspect --checkpoint DIR")
    if "progress: 2/3 steps" not in text:
        fail(f"inspect --checkpoint DIR does not show the newest checkpoint:\n{text}")
    # inspect's module table in kB/MB/GB, not raw byte counts.
    text = run(["inspect", "--model", model])[1]
    rows = [line for line in text.splitlines() if line.startswith("  transformer_blocks")]
    if not rows or not any(unit in rows[0] for unit in (" kB", " MB", " GB")):
        fail(f"inspect's module rows are not in kB/MB/GB:\n{text}")
    # plan: each strategy once, and no 0.00 ms time on a tiny model.
    text = run(["plan", "--model", model, "--world-size", "2"])[1]
    table = text.split("predicted stage times", 1)[1].splitlines()[2:4]
    names = [line.split()[0] for line in table]
    rounded_to_zero = [word for line in table for word in line.split() if re.fullmatch(r"([0-9]+:)?0\.0+", word)]
    if len(set(names)) != len(names) or rounded_to_zero:
        fail(f"plan's table repeats a strategy or rounds a time to 0.00:\n{text}")
    # A custom map that offloads to a cpu without a budget is planned with a warning, not silently.
    custom = tmp / "offload.json"
    custom.write_text('{"": 0, "single_transformer_blocks": "cpu"}')
    code, out, err = run(["plan", "--model", model, "--device-map", str(custom), "--max-memory", "0=1GB", "--json"])
    doc = json.loads(out) if code == 0 else {}
    if code != 0 or "whose budget is 0 B" not in err or not doc.get("warnings"):
        fail(f"a custom map over the cpu's 0 B budget is not warned about (exit {code}):\n{err}")
        print("ok: report size, inspect of a folder, inspect's units, plan's table")


def fake_hub_cache(tmp, model):
    """The tiny model laid out as huggingface_hub caches a download: blobs named by content, a snapshot of
    relative symbolic links into them, refs/main naming the snapshot's commit."""
    import hashlib
    cache = tmp / "hf-home" / "hub"
    repo = cache / "models--test-org--tiny-flux"
    commit = "0123456789abcdef0123456789abcdef01234567"
    for path in sorted(pathlib.Path(model).rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / path.relative_to(model)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return cache, commit


def case_hub_id(tmp):
    model = str(tiny_model(tmp))
    cache, commit = fake_hub_cache(tmp, model)
    no_network = {"HF_HUB_OFFLINE": "1"}
    for env in ({"HF_HUB_CACHE": str(cache)}, {"HF_HOME": str(cache.parent)}):
        env = dict(env, **no_network)
        where = ", ".join(f"{k}={v}" for k, v in env.items())
        expect_code(["inspect", "--model", "test-org/tiny-flux"], 0, f"inspect of a model id ({where})", env=env)
        expect_code(["plan", "--model", "test-org/tiny-flux", "--json"], 0, f"plan of a model id ({where})", env=env)
    env = dict(no_network, HF_HUB_CACHE=str(cache))
    common = ["--prompt", "cat", "--steps", "1", "--output-type", "latent"] + SMALL
    expect_code(["generate", "--model", model, "--out", str(tmp / "folder.h5")] + common, 0, "generate from the folder")
    log = expect_code(["generate", "--model", "test-org/tiny-flux", "--revision", commit,
                       "--out", str(tmp / "id.h5")] + common, 0, "generate from the id at a commit", env=env)
    if f"snapshots/{commit}" not in log:
        fail(f"generate does not say which snapshot the id resolved to:\n{log}")
    import h5py
    import numpy as np
    with h5py.File(tmp / "folder.h5", "r") as a, h5py.File(tmp / "id.h5", "r") as b:
        if not np.array_equal(a["latents"][()], b["latents"][()]):
            fail("the cached snapshot gave other latents than the folder it was made from")
    out = expect_code(["plan", "--model", "test-org/tiny-flux", "--revision", "v2"], 3, "a revision not cached",
                      "huggingface-cli download test-org/tiny-flux --revision v2", env=env)
    out = expect_code(["generate", "--model", "black-forest-labs/FLUX.1-dev", "--prompt", "cat"], 3,
                      "an id not cached", "huggingface-cli download black-forest-labs/FLUX.1-dev", env=env)
    error_lines = [line for line in out.splitlines() if "error" in line]
    if len(error_lines) != 1 or "licence" not in error_lines[0] or "snapshot_download" not in error_lines[0]:
        fail(f"an id not cached should get one line on how to download it (licence, snapshot_download):\n{out}")


def case_logs(tmp):
    model = str(tiny_model(tmp))
    args = ["generate", "--model", model, "--prompt", "cat", "--prompt", "dog", "--num-images-per-prompt", "2",
            "--microbatch-size", "1", "--steps", "3", "--output-type", "latent", "--checkpoint-every", "1",
            "--device", "cpu"] + SMALL
    log = expect_code(args + ["--out", str(tmp / "l1.h5"), "--checkpoint-dir", str(tmp / "ck-logs")], 0,
                      "a run of four microbatches")
    lines = log.splitlines()
    # "step k/N" names a denoising step only; the ring's progress counts images done.
    progress = [line for line in lines if "] progress " in line]
    if not progress or not all("images done" in line for line in progress):
        fail(f"the ring's progress lines do not count images done:\n{log}")
    stray = [line for line in lines if re.search(r"(?<!denoising )\bstep [0-9]+/[0-9]+", line)]
    if stray:
        fail("'step k/N' used for something else than a denoising step:\n" + "\n".join(stray))
    # Seconds for people: no 0.0012923 s.
    raw = [line for line in lines if re.search(r"[0-9]\.[0-9]{4,} ?s\b", line)]
    if raw:
        fail("unrounded seconds in the log:\n" + "\n".join(raw))
    if not any(re.search(r"\] stage [a-z]+: [0-9.]+ (us|ms|s) \(loading weights [0-9.]+ (us|ms|s)\)", line)
               for line in lines):
        fail(f"no stage line with rounded times:\n{log}")
    # Over two ranks the prefix carries the rank, and the message does not say it again.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    two = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1", BINARY] + args +
                         ["--out", str(tmp / "l2.h5"), "--checkpoint-dir", str(tmp / "ck-logs-2")],
                         capture_output=True, text=True, timeout=300, env=env)
    text = two.stdout + two.stderr
    if two.returncode != 0:
        fail(f"the 2-rank run exited {two.returncode}:\n{text}")
    twice = [line for line in text.splitlines() if re.search(r"\[rank ([0-9]+)\] \[[a-z]+\] rank \1: ", line)]
    if twice or "[rank 1]" not in text:
        fail("the rank said twice on a line (or no rank prefix):\n" + "\n".join(twice or text.splitlines()))
    print("ok: steps, progress, rounding and the rank prefix in the logs")


CASES = {"defaults": case_defaults, "logs": case_logs, "hub-id": case_hub_id, "issue-bugs": case_issue_bugs, "version": case_version, "exit-codes": case_exit_codes, "diffusers-names": case_diffusers_names,
         "did-you-mean": case_did_you_mean}

if __name__ == "__main__":
    if not BINARY:
        fail("set DIFFPIPE_BINARY to the built diffpipe")
    names = sys.argv[1:] or list(CASES)
    with tempfile.TemporaryDirectory(prefix="diffpipe-first-hour-") as tmp:
        for name in names:
            if name not in CASES:
                fail(f"unknown case {name!r} (cases: {', '.join(CASES)})")
            CASES[name](pathlib.Path(tmp))
    print("PASS")
