"""Multi-rank `diffpipe generate` under a real mpirun (CPU, MPI transport, --oversubscribe).

    mpi_generate_test.py CASE [--ranks N]

Cases:
  equal          N ranks give packed latents bit-identical to one process (fp32, same microbatch size), for
                 the default time-balanced split and for accelerate's "balanced" map.
  microbatches   microbatch sizes 1, 2 and 4 agree within 1e-6 of the latents' scale on N ranks.
  fail-at-load   rank N-1 runs on a copy of the model whose transformer file is truncated: every rank ends
                 non-zero within the bound and the coordinator's log names the rank and the file.
  killed-rank    rank N-1 is killed with SIGKILL mid-run: the job ends non-zero within the bound and, after the
                 kill, a failure line names that rank (mpirun's "process rank R ... exited on signal 9", or
                 rank 0's error line naming rank R).
  map-too-big    a device map naming more GPUs than ranks, and a max_memory too small for the model, both end
                 non-zero at once with a message that says why (rank 0's failure line gives the reason).
  disagreement   ranks started with different --dtype fail on the plan check, naming the ranks.
  transport-mpi  --transport mpi gives latents bit-identical to the default (auto, which is mpi on the CPU),
                 and --report records the transport.
  nccl-on-cpu    --transport nccl with --device cpu is refused on every rank before anything is loaded, with a
                 message that says why and what to use instead.
  report         --report writes one JSON per rank with its blocks, traffic and per-step times, consistent
                 across ranks (what one rank sends the next receives).
  offload        maps that offload blocks to "cpu" and "disk" (a custom JSON map, and "auto" with a small
                 --max-memory) still run every block, on the GPU rank whose range they continue, streamed
                 through the same double buffer as on a GPU (each such rank logs its copies): latents
                 bit-identical to one process with every block resident, at N ranks (N may be 1).
  components     --pipeline-device-map balanced with --max-memory 1=1GB puts CLIP, T5 and the VAE on rank 1
                 (and 0=1GB,1=1GB the VAE on rank 0, the encoders on rank 1), the transformer split over every
                 rank (or on rank 0 alone): PNGs and latents bit-identical to one process, each phase's
                 hf_device_map logged, each image's rank logged; a budget the VAE cannot share with rank 1's blocks decodes at the end,
                 says so, and gives the same images.
  incremental    several microbatches: images are written as microbatches finish, in order of completion, before
                 the last step (log order); rank 0, or the decoding worker, SIGKILLed after the first image
                 appears leaves that image complete and valid, and the job ends non-zero.
  bounded-memory a prompts file of 200 prompts runs with the coordinator's peak RSS within 1.5x of 20 prompts'.
  bad-component-map  a component map naming a GPU past the world is refused before loading, naming the component.
  lora           N ranks with a LoRA adapter and true CFG: ranks given another adapter scale are refused naming the
                 ranks; with --report each stage computes both CFG passes of every step (2 x steps for one image); a
                 NaN in the adapter's factors of the last rank's blocks is found by that rank before it loads and
                 named with the key; a truncated adapter, one for another model and a run config listing 10000
                 adapters end the job at once with one message naming the file (or the count).

  calibration    `diffpipe calibrate` on the CPU writes a valid file keyed "cpu (1 threads)"; plan and N ranks of
                 generate say they planned from it when it matches, and from FLOP-scaled times (saying why) when
                 it does not; a calibration whose double/single ratio differs strongly from the FLOP model's
                 moves the "pipeline" split (plan and the ring every rank agreed on) and leaves the latents
                 bit-identical; ranks given different calibrations are refused on the plan check, naming them.
  calibrate-on-load  --calibrate-on-load on N ranks: rank 0 times the blocks before anything loads, within its 2 s
                 bound, every rank plans from those times (the log says so) and agrees on the split; latents
                 bit-identical to the FLOP-scaled split's; ranks started with and without it are refused.

Needs DIFFPIPE_BINARY (the built diffpipe) and h5py/numpy (the pinned venv)."""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import h5py
import numpy as np

from mpi_case import fail, mpirun, run, run_case

BOUND_SECONDS = 30  # a failed run must end within this
PROMPTS = ["a cat sipping a margarita", "a lighthouse at dusk"]


def generate_args(model, out, extra=()):
    """generate's arguments; `extra` (flag, value, ...) adds options or replaces the defaults' values."""
    options = {"--model": str(model), "--dtype": "fp32", "--height": "64", "--width": "96", "--steps": "3",
               "--seed": "7", "--num-images-per-prompt": "2", "--max-sequence-length": "32",
               "--output-type": "latent", "--out": str(out)}
    extra = list(extra)
    for flag, value in zip(extra[0::2], extra[1::2]):
        options[flag] = value
    args = ["generate"]
    for flag, value in options.items():
        args += [flag, value]
    for p in PROMPTS:
        args += ["--prompt", p]
    return args


def latents(path):
    with h5py.File(path, "r") as f:
        return np.asarray(f["latents"])


def case_equal(binary, model, tmp, ranks):
    code, output, _ = run([binary] + generate_args(model, tmp / "one.h5", ["--microbatch-size", "1"]))
    if code != 0:
        fail(f"one process exited {code}:\n{output}")
    reference = latents(tmp / "one.h5")
    for device_map in ("pipeline", "balanced"):
        out = tmp / f"ranks-{device_map}.h5"
        extra = ["--microbatch-size", "1", "--device-map", device_map]
        if device_map == "balanced":
            extra += ["--max-memory", ",".join(f"{r}=1GB" for r in range(ranks))]
        code, output, seconds = run(mpirun(ranks) + [binary] + generate_args(model, out, extra))
        if code != 0:
            fail(f"{ranks} ranks ({device_map}) exited {code}:\n{output}")
        if "runtime: ring" not in output:
            fail(f"{ranks} ranks ({device_map}): no ring was logged:\n{output}")
        got = latents(out)
        if got.shape != reference.shape or not np.array_equal(got, reference):
            fail(f"{ranks} ranks ({device_map}): latents differ from one process, max abs difference "
                 f"{np.abs(got - reference).max() if got.shape == reference.shape else got.shape}")
        ring = [line for line in output.splitlines() if "runtime: ring" in line][0]
        print(f"{ranks} ranks, {device_map}: bit-identical to one process ({seconds:.1f} s); {ring.split('] ', 2)[-1][:160]}")


def case_microbatches(binary, model, tmp, ranks):
    results = {}
    for size in (1, 2, 4):
        out = tmp / f"mb{size}.h5"
        code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, out, ["--microbatch-size", str(size)]))
        if code != 0:
            fail(f"--microbatch-size {size} on {ranks} ranks exited {code}:\n{output}")
        results[size] = latents(out)
    scale = float(np.abs(results[1]).max())
    for size in (2, 4):
        error = float(np.abs(results[size] - results[1]).max()) / scale
        print(f"{ranks} ranks: microbatch {size} vs 1: max difference {error:.3g} of the scale")
        if not error <= 1e-6:
            fail(f"microbatch {size} differs from microbatch 1 by {error:.3g} of the scale (> 1e-6)")


def expect_bounded_failure(command, what, must_contain, timeout=BOUND_SECONDS + 30, line_pattern=None):
    """`command` must end non-zero within the bound, its output holding every text of `must_contain` and, when
    given, one line matching the regex `line_pattern` (a failure line that must say why in one place)."""
    code, output, seconds = run(command, timeout=timeout)
    if code == 0:
        fail(f"{what}: exited 0:\n{output}")
    if seconds > BOUND_SECONDS:
        fail(f"{what}: took {seconds:.1f} s to end (bound {BOUND_SECONDS} s)")
    for text in must_contain:
        if text not in output:
            fail(f"{what}: the output does not contain '{text}':\n{output}")
    if line_pattern is not None and not any(re.search(line_pattern, line) for line in output.splitlines()):
        fail(f"{what}: no line of the output matches /{line_pattern}/:\n{output}")
    print(f"{what}: exit {code} after {seconds:.1f} s, names {must_contain}")


def case_fail_at_load(binary, model, tmp, ranks):
    broken = tmp / "broken"
    shutil.copytree(model, broken)
    weights = broken / "transformer" / "diffusion_pytorch_model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size - 4096)
    last = ranks - 1
    command = (mpirun(ranks - 1) + [binary] + generate_args(model, tmp / "x.h5") + [":", "-np", "1", binary] +
               generate_args(broken, tmp / "x.h5"))
    expect_bounded_failure(command, f"rank {last} with a truncated transformer file",
                           [f"rank {last} failed", "diffusion_pytorch_model.safetensors"])
    if (tmp / "x.h5").exists():
        fail("a failed run left its output file")


def rank_pids(rank, marker):
    """PIDs of diffpipe-torch processes of MPI rank `rank` whose command line contains `marker`."""
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            exe = os.readlink(proc / "exe")
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if not exe.endswith("diffpipe-torch") or marker.encode() not in b" ".join(cmdline):
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def run_and_kill_rank(command, victim, out, trigger, waiting_for):
    """Runs `command`, SIGKILLs rank `victim` when a line containing `trigger` appears, and returns the exit
    code, the whole output and when the kill happened (None if the run ended first). Bounded: 300 s."""
    started = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, killed_at = [], None
    for line in job.stdout:
        output.append(line)
        if killed_at is None and trigger in line:
            pids = rank_pids(victim, str(out))
            if not pids:
                job.kill()
                fail(f"could not find rank {victim}'s process")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic()
        if time.monotonic() - started > 300:
            job.kill()
            fail(f"{waiting_for} within 300 s:\n" + "".join(output))
    return job.wait(), "".join(output), killed_at


def failure_lines_naming(text, rank):
    """The lines of `text` that report rank `rank`'s failure: mpirun's report of a process that died
    ("mpirun noticed that process rank R with PID P on node N exited on signal 9 (Killed)") or rank 0's error
    line naming it. Every log line of rank R carries "[rank R]", so that alone proves nothing."""
    mpirun_report = re.compile(rf"process rank {rank} with PID \d+ on node \S+ exited on signal 9\b")
    coordinator_error = re.compile(rf"\[rank 0\] \[error\] .*\brank {rank}\b")
    return [line for line in text.splitlines() if mpirun_report.search(line) or coordinator_error.search(line)]


def case_killed_rank(binary, model, tmp, ranks):
    out = tmp / "killed.h5"
    victim = ranks - 1
    args = generate_args(model, out, ["--steps", "400", "--transport-timeout", "20"])
    code, text, killed_at = run_and_kill_rank(mpirun(ranks) + [binary] + args, victim, out, "progress 1/400",
                                              "the run neither reached step 1 nor ended")
    if killed_at is None:
        fail(f"the run ended before step 1 (exit {code}):\n{text}")
    seconds = time.monotonic() - killed_at
    if code == 0:
        fail(f"killing rank {victim} mid-run still exited 0:\n{text}")
    if seconds > BOUND_SECONDS:
        fail(f"the job took {seconds:.1f} s to end after rank {victim} was killed (bound {BOUND_SECONDS} s)")
    # Only what was written after the kill counts (the kill follows the trigger line at once).
    named = failure_lines_naming(text.split("progress 1/400", 1)[1], victim)
    if not named:
        fail(f"no failure line after the kill names rank {victim}:\n{text}")
    if out.exists():
        fail("a killed run left its output file")
    print(f"rank {victim} killed with SIGKILL at step 1: job exit {code} {seconds:.1f} s later; "
          f"{named[0].strip()}")


def case_map_too_big(binary, model, tmp, ranks):
    device_map = tmp / "map.json"
    device_map.write_text('{"": %d}' % ranks)
    expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(model, tmp / "y.h5", ["--device-map", str(device_map)]),
                           "a device map naming GPU %d in a world of %d" % (ranks, ranks),
                           [f"device {ranks} is not in the world of {ranks}", "map.json"])
    expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(
        model, tmp / "y.h5", ["--max-memory", ",".join(f"{r}=10KB" for r in range(ranks)) + ",cpu=10KB"]),
        "a max_memory too small for the model", ["rank 0 failed"],
        line_pattern=r"\[rank 0\] \[error\] rank 0 failed: .*cannot fit the transformer .*with max_memory ")


def case_disagreement(binary, model, tmp, ranks):
    command = (mpirun(ranks - 1) + [binary] + generate_args(model, tmp / "z.h5") + [":", "-np", "1", binary] +
               generate_args(model, tmp / "z.h5", ["--dtype", "bf16"]))
    expect_bounded_failure(command, "ranks with different --dtype", ["disagree", f"ranks {ranks - 1}:"])


def case_report(binary, model, tmp, ranks):
    import json
    report = tmp / "report.json"
    code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, tmp / "r.h5", ["--report", str(report)]))
    if code != 0:
        fail(f"--report on {ranks} ranks exited {code}:\n{output}")
    docs = []
    for r in range(ranks):
        path = tmp / f"report.rank{r}.json"
        if not path.exists():
            fail(f"rank {r} wrote no {path.name}")
        doc = json.loads(path.read_text())
        if doc["rank"] != r or doc["world_size"] != ranks:
            fail(f"{path.name} says rank {doc['rank']} of {doc['world_size']}")
        if len(doc["per_step"]) != 3:
            fail(f"{path.name}: {len(doc['per_step'])} per-step records for 3 steps")
        if doc["microbatch_steps"] != 4 * 3:
            fail(f"{path.name}: {doc['microbatch_steps']} microbatch steps, expected 12 (4 images, 3 steps)")
        for key in ("compute_seconds", "receive_seconds", "send_seconds", "idle_seconds", "load_seconds"):
            if not doc[key] >= 0:
                fail(f"{path.name}: {key} = {doc[key]}")
        docs.append(doc)
    for doc in docs:
        peer = docs[doc["sends_to"]]
        # Each rank has one outbound and one inbound neighbour, so the bytes on a boundary match exactly.
        if peer["receives_from"] != doc["rank"] or peer["bytes_received"] != doc["bytes_sent"]:
            fail(f"rank {doc['rank']} sends {doc['bytes_sent']} bytes to rank {doc['sends_to']}, which receives "
                 f"{peer['bytes_received']} from rank {peer['receives_from']}")
    print(f"{ranks} per-rank reports: blocks {[d['blocks'] for d in docs]}, bytes sent {[d['bytes_sent'] for d in docs]}")


def case_transport_mpi(binary, model, tmp, ranks):
    import json
    outputs = {}
    for transport in ("default", "mpi"):
        out = tmp / f"{transport}.h5"
        extra = ["--report", str(tmp / f"{transport}.json")] + ([] if transport == "default" else ["--transport", transport])
        code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, out, extra))
        if code != 0:
            fail(f"--transport {transport} on {ranks} ranks exited {code}:\n{output}")
        if "transport mpi" not in output:
            fail(f"--transport {transport}: the start-up log does not name the transport mpi:\n{output}")
        outputs[transport] = latents(out)
        for r in range(ranks):
            doc = json.loads((tmp / f"{transport}.rank{r}.json").read_text())
            if doc.get("transport") != "mpi" or doc.get("compute_clock") != "host":
                fail(f"--transport {transport}: rank {r}'s report says transport {doc.get('transport')}, "
                     f"compute clock {doc.get('compute_clock')}")
    if outputs["mpi"].shape != outputs["default"].shape or not np.array_equal(outputs["mpi"], outputs["default"]):
        fail("--transport mpi differs from the default transport")
    print(f"{ranks} ranks: --transport mpi bit-identical to the default; reports name the transport")


def case_nccl_on_cpu(binary, model, tmp, ranks):
    out = tmp / "n.h5"
    expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(model, out, ["--transport", "nccl", "--device", "cpu"]),
                           "--transport nccl with --device cpu", ["--transport nccl", "needs --device cuda",
                                                                  "--transport mpi"])
    if out.exists():
        fail("a refused run left its output file")
    # The same check holds in a single process, before the model folder is even opened.
    code, output, _ = run([binary] + generate_args(tmp / "no-such-model", out, ["--transport", "nccl"]))
    if code == 0 or "needs --device cuda" not in output:
        fail(f"one process with --transport nccl on the CPU: exit {code}:\n{output}")


def transformer_blocks(model):
    import json
    config = json.loads((model / "transformer" / "config.json").read_text())
    return config["num_layers"], config["num_single_layers"]


def block_key(block, double_blocks):
    return (f"transformer_blocks.{block}" if block < double_blocks
            else f"single_transformer_blocks.{block - double_blocks}")


def offload_map(double_blocks, single_blocks, ranks):
    """GPU ranks in contiguous chunks, with offloaded blocks at the start (disk), in the middle of the chunks
    (cpu, then disk: each joins the rank before it) and at the end (cpu)."""
    total = double_blocks + single_blocks
    device = {b: min(b * ranks // total, ranks - 1) for b in range(total)}
    offloaded = {0: "disk"}
    for r in range(1, ranks):
        first = min(b for b in range(total) if device[b] == r)
        offloaded[first] = "cpu" if r % 2 else "disk"  # continues rank r - 1
    if ranks == 1:
        offloaded[total // 2] = "cpu"
    # The last block too, while its rank keeps a block on its GPU (every rank of the world stays in the ring).
    last_rank_gpu_blocks = [b for b in range(total) if device[b] == ranks - 1 and b not in offloaded]
    if len(last_rank_gpu_blocks) >= 2:
        offloaded[total - 1] = "cpu"
    mapping = {"x_embedder": 0, "context_embedder": 0, "time_text_embed": 0}
    for b in range(total):
        mapping[block_key(b, double_blocks)] = offloaded.get(b, device[b])
    mapping["norm_out"] = "cpu"
    mapping["proj_out"] = "cpu"
    expected = {}  # rank -> offloaded blocks it must run
    owner = None
    for b in range(total):
        if b in offloaded:
            rank = owner if owner is not None else device[min(x for x in range(total) if x not in offloaded)]
            expected.setdefault(rank, []).append(b)
        else:
            rank = device[b]
        owner = rank
    return mapping, expected


def plan_json(binary, model, extra):
    import json
    code, output, _ = run([binary, "plan", "--model", str(model), "--json", "--dtype", "fp32"] + extra)
    if code != 0:
        fail(f"plan {' '.join(extra)} exited {code}:\n{output}")
    return json.loads(output[output.index("{"):])


def auto_offload_max_memory(binary, model, ranks):
    """A --max-memory under which accelerate's "auto" puts blocks on GPUs (every GPU of the world, or at least
    two: accelerate keeps the largest layer free on GPU 0), then on cpu, then on disk. Searched in fractions of
    the transformer's size, so that it follows the tiny model's sizes."""
    total = plan_json(binary, model, ["--device-map", "auto"])["transformer"]["total_bytes"]
    for first in range(6, 16):
        for other in range(1, 9):
            for cpu in range(2, 11):
                budget = ",".join([f"0={total * first * 75 // 1000}"] +
                                  [f"{r}={total * other * 75 // 2000}" for r in range(1, ranks)] +
                                  [f"cpu={total * cpu * 75 // 1000}"])
                hf_map = plan_json(binary, model, ["--device-map", "auto", "--max-memory", budget])["hf_device_map"]
                on = {str(device) for key, device in hf_map.items() if "blocks" in key}
                if {"cpu", "disk"} <= on and sum(str(r) in on for r in range(ranks)) >= min(ranks, 2):
                    return budget, hf_map
    fail(f"found no --max-memory that makes auto put blocks on GPUs, cpu and disk ({ranks} GPUs, transformer "
         f"{total} bytes)")


def case_offload(binary, model, tmp, ranks):
    import json
    code, output, _ = run([binary] + generate_args(model, tmp / "resident.h5", ["--microbatch-size", "1"]))
    if code != 0:
        fail(f"one process, every block resident, exited {code}:\n{output}")
    if "offloaded" in output:
        fail(f"the resident reference run offloads blocks:\n{output}")
    reference = latents(tmp / "resident.h5")
    double_blocks, single_blocks = transformer_blocks(model)
    mapping, expected = offload_map(double_blocks, single_blocks, ranks)
    (tmp / "offload.json").write_text(json.dumps(mapping))
    budget, auto_map = auto_offload_max_memory(binary, model, ranks)
    launch = mpirun(ranks)
    for name, extra in (("custom map", ["--device-map", str(tmp / "offload.json")]),
                        ("auto map", ["--device-map", "auto", "--max-memory", budget])):
        out = tmp / f"offload-{name.split()[0]}.h5"
        code, output, seconds = run(launch + [binary] + generate_args(model, out, ["--microbatch-size", "1"] + extra))
        if code != 0:
            fail(f"{ranks} rank(s), {name}: exited {code}:\n{output}")
        ring = [line for line in output.splitlines() if "runtime: ring" in line]
        if not ring or "offloaded (" not in ring[0]:
            fail(f"{ranks} rank(s), {name}: no ring with offloaded blocks was logged:\n{output}")
        # Each rank that runs offloaded blocks streams them (models/flux/flux_offload.h, on the CPU too) and
        # says so: "[rank R] [info] K offloaded block(s) streamed in N copies" (one process: "rank R: K ...").
        streamed = {int(m.group(1) or m.group(2)): (int(m.group(3)), int(m.group(4))) for m in re.finditer(
            r"(?:\[rank (\d+)\] \[\w+\] (?:rank \d+: )?|rank (\d+): )(\d+) offloaded block\(s\) streamed in (\d+) copies",
            output)}
        if not streamed:
            fail(f"{ranks} rank(s), {name}: no rank logged streaming its offloaded blocks:\n{output}")
        if name == "custom map":
            for rank, blocks in expected.items():
                wanted = f"rank {rank} blocks ["
                stage = [part for part in ring[0].split("; hf_device_map")[0].split("rank ") if part.startswith(f"{rank} ")]
                if not stage or f"{len(blocks)} offloaded" not in stage[0]:
                    fail(f"{ranks} rank(s), {name}: {wanted}...) should run offloaded blocks {blocks}:\n{ring[0]}")
                if streamed.get(rank, (0, 0))[0] != len(blocks):
                    fail(f"{ranks} rank(s), {name}: rank {rank} should stream {len(blocks)} offloaded block(s), "
                         f"logged {streamed.get(rank)}:\n{output}")
        got = latents(out)
        if got.shape != reference.shape or not np.array_equal(got, reference):
            fail(f"{ranks} rank(s), {name}: latents differ from the resident run, max abs difference "
                 f"{np.abs(got - reference).max() if got.shape == reference.shape else got.shape}")
        print(f"{ranks} rank(s), {name}: bit-identical to every block resident ({seconds:.1f} s); streamed "
              f"(rank: blocks, copies) {streamed}; {ring[0].split('runtime: ')[-1][:200]}")
    # plan shows the same ring the runtime logged.
    plan = plan_json(binary, model, ["--device-map", str(tmp / "offload.json"), "--world-size", str(ranks)])
    if len(plan["ranks"]["ring"]) != ranks:
        fail(f"the custom map should keep all {ranks} ranks in the ring: {plan['ranks']}")
    text = " -> ".join(stage["text"] for stage in plan["ranks"]["ring"])
    for rank, blocks in expected.items():
        if not any(s["rank"] == rank and [o["block"] for o in s.get("offloaded", [])] == blocks
                   for s in plan["ranks"]["ring"]):
            fail(f"plan's ring does not give rank {rank} offloaded blocks {blocks}: {text}")
    print(f"plan: {text}")


def tiny_block_map(tmp, ranks):
    """A transformer map spreading make-tiny's blocks (2 double-stream, 4 single-stream) over `ranks` ranks."""
    import json
    singles = 4
    doc = {"x_embedder": 0, "time_text_embed": 0, "context_embedder": 0, "transformer_blocks": 0}
    for i in range(singles):
        doc[f"single_transformer_blocks.{i}"] = min(ranks - 1, 1 + i * (ranks - 1) // singles) if ranks > 1 else 0
    doc["norm_out"] = doc["proj_out"] = ranks - 1
    path = tmp / f"blocks-{ranks}.json"
    path.write_text(json.dumps(doc))
    return path


def rank0_lines(output):
    return [line for line in output.splitlines() if "[rank 0]" in line or "[rank" not in line]


def png_ok(path):
    """A complete PNG: signature, chunks with their CRCs, IEND last; and the pixels decode."""
    import zlib
    data = pathlib.Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return "no PNG signature"
    offset, last = 8, None
    while offset < len(data):
        if offset + 12 > len(data):
            return f"truncated chunk at byte {offset}"
        length = int.from_bytes(data[offset:offset + 4], "big")
        kind = data[offset + 4:offset + 8]
        body = data[offset + 8:offset + 8 + length]
        crc = int.from_bytes(data[offset + 8 + length:offset + 12 + length], "big")
        if len(body) != length or zlib.crc32(kind + body) != crc:
            return f"chunk {kind!r} at byte {offset} is truncated or corrupt"
        offset += 12 + length
        last = kind
    if last != b"IEND":
        return "no IEND chunk"
    from PIL import Image
    with Image.open(path) as image:
        image.load()
    return None


def case_components(binary, model, tmp, ranks):
    blocks = tiny_block_map(tmp, ranks)
    whole_ring_on_0 = tmp / "all-on-0.json"
    whole_ring_on_0.write_text('{"": 0}')
    for output_type, ext in (("png", "png"), ("latent", "h5")):
        one = tmp / f"one-{output_type}.{ext}"
        # One thread, as every rank runs (mpirun -x OMP_NUM_THREADS=1): the VAE's fp32 convolutions on the CPU
        # round differently with another thread count, the transformer's do not.
        code, output, _ = run(["env", "OMP_NUM_THREADS=1", binary] + generate_args(model, one, ["--output-type", output_type]))
        if code != 0:
            fail(f"one process ({output_type}) exited {code}:\n{output}")
        # (max_memory, where CLIP, T5 and the VAE must run, whether rank 1 keeps the VAE through denoising)
        # (max_memory, where CLIP, T5 and the VAE must run, whether rank 1 keeps the VAE through denoising, the
        # blocks' map, more flags)
        configs = [("1=1GB", {"text_encoder": 1, "text_encoder_2": 1, "vae": 1}, True, blocks, []),
                   ("0=1GB,1=1GB", {"text_encoder": 1, "text_encoder_2": 1, "vae": 0}, True, blocks, [])]
        if output_type == "png":
            # Rank 0 runs every block while rank 1 decodes: rank 0 takes the images between its own steps.
            configs.append(("1=1GB", {"text_encoder": 1, "text_encoder_2": 1, "vae": 1}, True, whole_ring_on_0, []))
            # 1.5 MB holds the three components (1.45 MB at fp32) but not the VAE next to rank 1's blocks and
            # a microbatch's activations: the decode runs after denoising instead.
            configs.append(("1=1500KB", {"text_encoder": 1, "text_encoder_2": 1, "vae": 1}, False, blocks, []))
        else:
            # Rank 1 encodes and holds blocks: they load on its loader thread, within the early allowance.
            configs.append(("1=1GB", {"text_encoder": 1, "text_encoder_2": 1, "vae": 1}, True, blocks,
                            ["--load-overlap", "on"]))
        for max_memory, where, resident, block_map, flags in configs:
            name = f"{output_type}-{max_memory.replace(',', '_').replace('=', '-')}-{block_map.stem}{''.join(flags)}"
            out = tmp / f"ranks-{name}.{ext}"
            extra = ["--output-type", output_type, "--pipeline-device-map", "balanced", "--max-memory", max_memory,
                     "--device-map", str(block_map)] + flags
            code, output, seconds = run(mpirun(ranks) + [binary] + generate_args(model, out, extra))
            what = f"{ranks} ranks, {output_type}, --max-memory {max_memory}, blocks {block_map.stem} {' '.join(flags)}"
            if code != 0:
                fail(f"{what}: exited {code}:\n{output}")
            encode = '{"text_encoder":%s,"text_encoder_2":%s}' % (where["text_encoder"], where["text_encoder_2"])
            expected_lines = [f"phase encode: hf_device_map {encode}", "phase denoise: hf_device_map {"]
            if flags:
                expected_lines.append("[rank 1] [info] load overlap on: --load-overlap on: ")
            if output_type == "png":
                expected_lines.append('phase decode: hf_device_map {"vae":%s}' % where["vae"])
                expected_lines.append(f"(image 0, decoded on rank {where['vae']})")
                expected_lines.append("decode at the end" if not resident else "the VAE stays loaded through denoising")
            for text in expected_lines:
                if text not in output:
                    fail(f"{what}: the log does not say '{text}':\n{output}")
            if output_type == "png":
                for i in range(4):
                    ours, theirs = out.with_name(f"{out.stem}-{i}.png"), one.with_name(f"{one.stem}-{i}.png")
                    if not ours.exists() or ours.read_bytes() != theirs.read_bytes():
                        fail(f"{what}: {ours.name} differs from one process's {theirs.name} (or is missing)")
            else:
                got, reference = latents(out), latents(one)
                if got.shape != reference.shape or not np.array_equal(got, reference):
                    fail(f"{what}: latents differ from one process")
            print(f"{what}: bit-identical to one process ({seconds:.1f} s); encode {encode}, vae on rank "
                  f"{where['vae']}{'' if resident else ' (decoded at the end)'}")


def case_incremental(binary, model, tmp, ranks):
    # A normal run: 4 microbatches of one image; each microbatch's image is written when it finishes.
    for world in (1, ranks):
        out = tmp / f"inc{world}.png"
        launcher = mpirun(world) if world > 1 else []
        code, output, _ = run(launcher + [binary] + generate_args(model, out, ["--output-type", "png", "--steps", "6"]))
        if code != 0:
            fail(f"{world} rank(s): exited {code}:\n{output}")
        lines = rank0_lines(output)
        finished = [l.split("microbatch ", 1)[1].split(" ")[0] for l in lines if "] microbatch " in l and " finished " in l]
        wrote = [l for l in lines if "] wrote " in l]
        order = [l.split(f"{out.stem}-", 1)[1].split(".png")[0] for l in wrote]
        if finished != ["0", "1", "2", "3"] or order != finished:
            fail(f"{world} rank(s): microbatches finished {finished}, images written {order}:\n{output}")
        last_step = next((i for i, l in enumerate(lines) if "progress 6/6 " in l), None)
        first_write = next(i for i, l in enumerate(lines) if "] wrote " in l)
        if last_step is None or not first_write < last_step:
            fail(f"{world} rank(s): the first image was not written before the last step:\n{output}")
        # The last microbatch waits for the blocks to be freed, so that its decode does not add to their memory.
        deferred = next((i for i, l in enumerate(lines) if "microbatch 3, the last, is decoded once" in l), None)
        last_write = max(i for i, l in enumerate(lines) if "] wrote " in l)
        if deferred is None or not last_step < last_write or not deferred < last_write:
            fail(f"{world} rank(s): the last image was not decoded after the loop, once the blocks were freed:\n"
                 f"{output}")
        print(f"{world} rank(s): images written in order of completion {order}, the first before progress 6/6, "
              "the last after the loop")

    # Rank 0 killed once the first image is on disk, and the decoding worker (the VAE on rank 1): the images
    # already written stay, complete.
    kill_after_first_image(binary, model, tmp, ranks, 0, "killed", [])
    kill_after_first_image(binary, model, tmp, ranks, 1, "killedvae",
                           ["--pipeline-device-map", "balanced", "--max-memory", "1=1GB"])


def kill_after_first_image(binary, model, tmp, ranks, victim, stem, extra):
    out = tmp / f"{stem}.png"
    args = generate_args(model, out, ["--output-type", "png", "--steps", "300"] + extra)
    code, text, killed_at = run_and_kill_rank(mpirun(ranks) + [binary] + args, victim, out, "] wrote ",
                                              "no image")
    if killed_at is None:
        fail(f"the run wrote no image before it ended (exit {code}):\n{text}")
    if code == 0:
        fail(f"killing rank {victim} still exited 0:\n{text}")
    if time.monotonic() - killed_at > BOUND_SECONDS:
        fail(f"the job took more than {BOUND_SECONDS} s to end after rank {victim} was killed")
    first = out.with_name(f"{stem}-0.png")
    problem = png_ok(first) if first.exists() else "missing"
    if problem:
        fail(f"{first.name} after the kill: {problem}")
    if out.with_name(f"{stem}-3.png").exists():
        fail("the last image exists too: the kill came after the run, so it shows nothing")
    # Every output name on disk is a complete image. A SIGKILL can leave the atomic writer's hidden
    # ".NAME.XXXXXX.partial" temporary (no handler runs), which is never taken for an output.
    left = sorted(p.name for p in tmp.iterdir() if p.name.startswith(stem + "-"))
    for name in left:
        problem = png_ok(tmp / name) if name.endswith(".png") else f"stray file {name}"
        if problem:
            fail(f"{name} after the kill: {problem}")
    print(f"rank {victim} SIGKILLed after the first image: exit {code}; on disk {left}, each a complete PNG")


def case_bounded_memory(binary, model, tmp, ranks):
    import json
    # 256x256: a batch's VAE decode at the end would hold every image's activations (about 24 MB each, 4.8 GB for
    # 200 on the old path), while decoding microbatch by microbatch holds one. What legitimately grows with the
    # prompts (initial noise 13 MB, embeddings, file names) stays far below half the ~400 MB LibTorch baseline,
    # hence the bound of 1.5x.
    peaks = {}
    for count in (20, 200):
        prompts = tmp / f"prompts{count}.txt"
        prompts.write_text("".join(f"prompt number {i}\n" for i in range(count)))
        outdir = tmp / f"out{count}"
        outdir.mkdir()
        report = tmp / f"report{count}.json"
        command = mpirun(ranks) + [binary, "generate", "--model", str(model), "--dtype", "fp32", "--height", "256",
                                   "--width", "256", "--steps", "2", "--max-sequence-length", "32", "--prompts-file",
                                   str(prompts), "--out", str(outdir / "x.png"), "--report", str(report)]
        code, output, seconds = run(command, timeout=900)
        if code != 0:
            fail(f"{count} prompts exited {code}:\n{output}")
        written = len(list(outdir.glob("x-*.png")))
        if written != count:
            fail(f"{count} prompts: {written} images written")
        doc = json.loads((tmp / f"report{count}.rank0.json").read_text())
        peaks[count] = doc["peak_resident_bytes"]
        print(f"{count} prompts: {seconds:.1f} s, coordinator peak RSS {peaks[count] / 1e6:.1f} MB")
    ratio = peaks[200] / peaks[20]
    print(f"peak RSS 200 vs 20 prompts: {ratio:.2f}x (bound 1.5x)")
    if not ratio <= 1.5:
        fail(f"the coordinator's peak RSS grew {ratio:.2f}x from 20 to 200 prompts (bound 1.5x)")


def case_bad_component_map(binary, model, tmp, ranks):
    # Budgets on GPUs 0 and `ranks`: balanced puts the VAE on GPU 0 and T5 on GPU `ranks`, past the world.
    command = mpirun(ranks) + [binary] + generate_args(model, tmp / "b.png", [
        "--output-type", "png", "--pipeline-device-map", "balanced", "--max-memory", f"0=1GB,{ranks}=1GB"])
    code, output, seconds = run(command, timeout=BOUND_SECONDS + 30)
    if code == 0:
        fail(f"a map naming GPU {ranks} in a world of {ranks} exited 0:\n{output}")
    if seconds > BOUND_SECONDS:
        fail(f"the refusal took {seconds:.1f} s (bound {BOUND_SECONDS} s)")
    for text in ("text_encoder_2", f"on GPU {ranks}", f"the world has {ranks} rank(s)"):
        if text not in output:
            fail(f"the refusal does not say '{text}':\n{output}")
    for text in ("loaded blocks", "stage encode", "CLIP load"):
        if text in output:
            fail(f"'{text}' in the log: the map was refused only after loading began:\n{output}")
    if list(tmp.glob("b*.png")):
        fail("a refused run left an image")
    print(f"GPU {ranks} in a world of {ranks}: refused in {seconds:.1f} s before loading, naming text_encoder_2")


def write_tiny_lora(model, path, nan_block=None):
    """A kohya adapter for make-tiny's transformer (widths from its config): a double block's qkv and context MLP,
    every single block's linear2, with alphas; `nan_block` (a single block's index) gets a NaN in its up factor."""
    import json
    import torch
    from safetensors.torch import save_file
    config = json.loads((model / "transformer" / "config.json").read_text())
    d = config["num_attention_heads"] * config["attention_head_dim"]
    gen = torch.Generator().manual_seed(3)
    modules = [("double_blocks_0_img_attn_qkv", d, 3 * d), ("double_blocks_0_txt_mlp_0", d, 4 * d)]
    modules += [(f"single_blocks_{i}_linear2", 5 * d, d) for i in range(config["num_single_layers"])]
    sd = {}
    for name, n_in, n_out in modules:
        sd[f"lora_unet_{name}.lora_down.weight"] = torch.randn(4, n_in, generator=gen) * 0.2
        up = torch.randn(n_out, 4, generator=gen) * 0.2
        if nan_block is not None and name == f"single_blocks_{nan_block}_linear2":
            up[1, 2] = float("nan")
        sd[f"lora_unet_{name}.lora_up.weight"] = up
        sd[f"lora_unet_{name}.alpha"] = torch.tensor(2.0)
    save_file(sd, str(path))
    return config


def case_lora(binary, model, tmp, ranks):
    import json
    lora = tmp / "style.safetensors"
    config = write_tiny_lora(model, lora)
    extras = ["--lora", f"style={lora}:0.8", "--negative-prompt", "dull", "--true-cfg-scale", "3"]
    command = (mpirun(ranks - 1) + [binary] + generate_args(model, tmp / "z.h5", extras) + [":", "-np", "1", binary] +
               generate_args(model, tmp / "z.h5", ["--lora", f"style={lora}:0.9"] + extras[2:]))
    expect_bounded_failure(command, "ranks with another adapter scale", ["disagree", f"ranks {ranks - 1}:"])

    # One image, true CFG: every stage computes both passes of each of the 3 steps.
    report = tmp / "report.json"
    one = ["--num-images-per-prompt", "1", "--report", str(report)] + extras
    args = generate_args(model, tmp / "cfg.h5", one)
    args = args[:len(args) - 2 * len(PROMPTS)] + ["--prompt", PROMPTS[0]]  # one prompt instead of PROMPTS
    code, output, _ = run(mpirun(ranks) + [binary] + args)
    if code != 0:
        fail(f"true CFG with a LoRA on {ranks} ranks exited {code}:\n{output}")
    for r in range(ranks):
        doc = json.loads((tmp / f"report.rank{r}.json").read_text())
        if doc["blocks"] is not None and doc["microbatch_steps"] != 2 * 3:
            fail(f"rank {r} (blocks {doc['blocks']}) computed {doc['microbatch_steps']} passes, expected 6 "
                 "(both CFG passes of 3 steps)")
    print(f"true CFG with a LoRA on {ranks} ranks: every stage ran both passes of every step")

    # A NaN in the last single block's factors: the rank holding it names the key before loading its blocks.
    nan = tmp / "nan.safetensors"
    write_tiny_lora(model, nan, nan_block=config["num_single_layers"] - 1)
    last = ranks - 1
    expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(model, tmp / "n.h5", ["--lora", str(nan)]),
                           "a NaN in the last blocks' adapter factors",
                           [f"rank {last} failed", "non-finite", f"single_blocks_{config['num_single_layers'] - 1}_linear2.lora_up.weight"])
    truncated = tmp / "truncated.safetensors"
    truncated.write_bytes(lora.read_bytes()[:-100])
    another = tmp / "sdxl.safetensors"
    import torch
    from safetensors.torch import save_file
    save_file({"lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": torch.zeros(4, 8),
               "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": torch.zeros(8, 4)}, str(another))
    for path, what, words in ((truncated, "a truncated adapter", ["truncated.safetensors"]),
                              (another, "an adapter for another model", ["sdxl.safetensors", "another model"])):
        expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(model, tmp / "b.h5", ["--lora", str(path)]),
                               what, words)
    # A run config listing 10000 adapters (a command line that long would not even start).
    config = tmp / "many.json"
    config.write_text(json.dumps({"lora": [{"path": str(lora), "scale": 0.5, "name": f"a{i}"} for i in range(10000)]}))
    expect_bounded_failure(mpirun(ranks) + [binary] + generate_args(model, tmp / "m.h5", ["--config", str(config)]),
                           "a run config with 10000 adapters", ["10000 LoRA adapters", "at most 64"])



def calibration_file(path, entries):
    import json
    path.write_text(json.dumps({"format": "diffpipe-calibration", "version": 1, "entries": entries}))


def ring_line(output):
    lines = [line for line in output.splitlines() if "runtime: ring" in line]
    if not lines:
        fail(f"no ring was logged:\n{output}")
    return lines[0].split("runtime: ring", 1)[1].split("; hf_device_map")[0].strip()


def case_calibration(binary, model, tmp, ranks):
    import json
    real = tmp / "real.json"
    code, output, _ = run([binary, "calibrate", "--model", str(model), "--threads", "1", "--dtype", "fp32",
                           "--height", "64", "--width", "96", "--text-tokens", "32", "--microbatch-size", "1,2",
                           "--warmup", "1", "--repeat", "3", "--calibration", str(real)])
    if code != 0 or "wrote 2 entries" not in output:
        fail(f"calibrate exited {code}:\n{output}")
    entries = json.loads(real.read_text())["entries"]
    if [e["device"] for e in entries] != ["cpu (1 threads)"] * 2 or [e["microbatch"] for e in entries] != [1, 2]:
        fail(f"calibrate wrote {entries}")
    key = entries[0]
    print(f"calibrate: {key['device']} {key['height']}x{key['width']}: double {key['double_block_ms']:.3f} ms, "
          f"single {key['single_block_ms']:.3f} ms")
    # The measured file matches generate's run (same device name, dtype, shape, tokens, microbatch).
    code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, tmp / "real.h5",
                          ["--microbatch-size", "1", "--calibration", str(real)]))
    if code != 0 or "planned from calibrated block times: " + str(real) not in output:
        fail(f"{ranks} ranks with the measured calibration exited {code} or did not say so:\n{output}")
    # One that differs from the FLOP model: double blocks 20x a single block.
    skewed = dict(key, double_block_ms=20.0, single_block_ms=1.0, embedders_ms=0.0, output_ms=0.0)
    skewed_path = tmp / "skewed.json"
    calibration_file(skewed_path, [skewed])
    runs = {}
    for name, extra in (("flops", ["--no-calibration"]), ("skewed", ["--calibration", str(skewed_path)])):
        out = tmp / f"{name}.h5"
        code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, out, ["--microbatch-size", "1"]) + extra)
        if code != 0:
            fail(f"{ranks} ranks ({name}) exited {code}:\n{output}")
        said = "planned from calibrated block times" if name == "skewed" else "planned from FLOP-scaled block times"
        if said not in output:
            fail(f"{ranks} ranks ({name}) did not say '{said}':\n{output}")
        runs[name] = (ring_line(output), latents(out))
        print(f"{ranks} ranks, {name}: ring {runs[name][0]}")
    if runs["flops"][0] == runs["skewed"][0]:
        fail(f"the calibrated split is the FLOP-scaled one: {runs['flops'][0]}")
    if not np.array_equal(runs["flops"][1], runs["skewed"][1]):
        fail("the calibrated split changed the latents")
    # plan reads the same file at the key calibrate wrote (the transformer's shape, as generate plans it).
    plans = {name: plan_json(binary, model, ["--device-map", "pipeline", "--world-size", str(ranks),
                                             "--height", str(key["height"]), "--width", str(key["width"]),
                                             "--text-tokens", "32", "--microbatch-size", "1"] + extra)
             for name, extra in (("flops", ["--no-calibration"]), ("skewed", ["--calibration", str(skewed_path)]))}
    if not plans["skewed"]["calibration"]["used"] or plans["flops"]["calibration"]["used"]:
        fail(f"plan's calibration: {plans['skewed']['calibration']} / {plans['flops']['calibration']}")
    if plans["flops"]["hf_device_map"] == plans["skewed"]["hf_device_map"]:
        fail(f"plan's calibrated map is the FLOP-scaled one: {plans['flops']['hf_device_map']}")
    # A key that does not match (another microbatch size) is not used, and the run says why.
    code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, tmp / "other.h5",
                          ["--microbatch-size", "4", "--calibration", str(skewed_path)]))
    if code != 0 or "not used: no entry for cpu (1 threads)" not in output or "microbatch 4" not in output:
        fail(f"a calibration of another microbatch size: exit {code}, or the log does not say why:\n{output}")
    # Ranks with different calibrations plan different splits: refused on the plan check, naming the ranks.
    command = (mpirun(ranks - 1) + [binary] + generate_args(model, tmp / "z.h5", ["--calibration", str(skewed_path)]) +
               [":", "-np", "1", binary] + generate_args(model, tmp / "z.h5") + ["--no-calibration"])
    expect_bounded_failure(command, "ranks with different calibrations", ["plan", "disagree", f"ranks {ranks - 1}:"])




def case_calibrate_on_load(binary, model, tmp, ranks):
    code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, tmp / "flops.h5", ["--microbatch-size", "1"]) +
                          ["--no-calibration"])
    if code != 0:
        fail(f"{ranks} ranks without calibration exited {code}:\n{output}")
    code, output, seconds = run(mpirun(ranks) + [binary] + generate_args(model, tmp / "on-load.h5",
                                ["--microbatch-size", "1"]) + ["--calibrate-on-load"])
    if code != 0:
        fail(f"{ranks} ranks with --calibrate-on-load exited {code}:\n{output}")
    measured = [line for line in output.splitlines() if "--calibrate-on-load: " in line]
    if not measured or "planned from block times measured on load" not in output:
        fail(f"--calibrate-on-load: no measurement or plan line logged:\n{output}")
    took = re.search(r"measured in ([0-9.e-]+) s", measured[0])
    if not took or float(took.group(1)) > 2.0:
        fail(f"--calibrate-on-load took longer than its 2 s bound: {measured[0]}")
    print(f"{ranks} ranks: {measured[0].split('] ', 2)[-1]}")
    print(f"  ring {ring_line(output)} ({seconds:.1f} s in all)")
    if not np.array_equal(latents(tmp / "flops.h5"), latents(tmp / "on-load.h5")):
        fail("--calibrate-on-load changed the latents")
    command = (mpirun(ranks - 1) + [binary] + generate_args(model, tmp / "z.h5") + ["--calibrate-on-load"] +
               [":", "-np", "1", binary] + generate_args(model, tmp / "z.h5"))
    expect_bounded_failure(command, "ranks with and without --calibrate-on-load", ["disagree", f"ranks {ranks - 1}:"])


def case_start_up_paths(binary, model, tmp, ranks):
    # The start-up paths (the early CUDA start, on by default, named anyway: on a machine without a CUDA driver
    # it says so and starts nothing; DIFFPIPE_WARM_UP_BESIDE_LOAD=1: the blocks' warm-up beside their load, the
    # default on CUDA, which on the CPU runs only when asked) and DIFFPIPE_MODULATION_TABLE=1 (rank 0's first stage
    # takes its blocks' modulation rows from a table of the whole schedule, the other ranks a step at a time) leave
    # the latents as the default run's, in one process and on every rank.
    code, output, _ = run([binary] + generate_args(model, tmp / "default.h5"))
    if code != 0:
        fail(f"one process exited {code}:\n{output}")
    reference = latents(tmp / "default.h5")
    opt_in = ["env", "DIFFPIPE_EARLY_CUDA=1", "DIFFPIPE_WARM_UP_BESIDE_LOAD=1", "DIFFPIPE_MODULATION_TABLE=1"]
    for world in (1, ranks):
        out = tmp / f"opt-in-{world}.h5"
        launcher = mpirun(world) if world > 1 else []
        code, output, seconds = run(opt_in + launcher + [binary, "--log-level", "debug"] + generate_args(model, out))
        if code != 0:
            fail(f"{world} rank(s) with the opt-in paths exited {code}:\n{output}")
        got = latents(out)
        if got.shape != reference.shape or not np.array_equal(got, reference):
            fail(f"{world} rank(s) with the opt-in paths: latents differ from the default run")
        lines = output.splitlines()
        for rank in range(world):
            tag = f"[rank {rank}] " if world > 1 else ""
            mine = [l for l in lines if tag in l]
            if not any("CUDA started before main(): " in l for l in mine):
                fail(f"rank {rank} does not say what the early CUDA start did:\n{output}")
            if not any("while the blocks loaded" in l for l in mine):
                fail(f"rank {rank} did not warm its blocks up beside their load:\n{output}")
        if not any("the modulation rows of" in l for l in lines):
            fail(f"no modulation table was made with DIFFPIPE_MODULATION_TABLE=1:\n{output}")
        print(f"{world} rank(s) with DIFFPIPE_EARLY_CUDA=1 DIFFPIPE_WARM_UP_BESIDE_LOAD=1 "
              f"DIFFPIPE_MODULATION_TABLE=1: bit-identical to the default ({seconds:.1f} s)")


CASES = {"components": case_components, "incremental": case_incremental, "bounded-memory": case_bounded_memory,
         "bad-component-map": case_bad_component_map,
         "equal": case_equal, "microbatches": case_microbatches, "fail-at-load": case_fail_at_load,
         "killed-rank": case_killed_rank, "map-too-big": case_map_too_big, "disagreement": case_disagreement,
         "report": case_report, "transport-mpi": case_transport_mpi, "nccl-on-cpu": case_nccl_on_cpu,
         "offload": case_offload, "lora": case_lora, "calibration": case_calibration,
         "calibrate-on-load": case_calibrate_on_load, "start-up-paths": case_start_up_paths}


if __name__ == "__main__":
    run_case(CASES, "diffpipe-mpi", default_ranks=3)
