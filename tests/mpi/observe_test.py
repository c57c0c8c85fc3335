"""What a run leaves to look at afterwards: PNG text chunks, merged --report tables and --trace timelines.

    observe_test.py CASE [--ranks N]

Cases:
  png-text       generate writes the prompt, seed, steps, guidance, size, model and version into every PNG as
                 text chunks: PIL reads them, a plain zlib/struct walk of the chunks agrees, and
                 `diffpipe inspect FILE.png` prints them back; a damaged chunk is refused naming the file.
  report         `diffpipe report DIR` merges a real N-rank run's --report files into one table (and --json);
                 refuses a damaged file, a missing rank and reports of two runs mixed, naming the file.
  trace          generate --trace on N ranks, whose clocks are skewed seconds apart, writes one Chrome trace-event
                 file that a trace viewer's schema accepts: required keys and types per phase, non-negative
                 durations, a pid track and a process_name per rank, complete events nested per track, the
                 expected names per rank, compute spans matching --report; the measured clock offsets recover
                 the skews and every message is received after it began to be sent.
  torch-profile  generate --torch-profile on N ranks: rank 0 writes LibTorch's profile of the first
                 --torch-profile-steps steps (its ATen ops and its compute spans, those steps only), or of the whole
                 loop when it is shorter; bench/first_step_trace.py reads it; the latents are bit-identical to a run
                 without it; a path in a missing folder is refused before anything loads.

Needs DIFFPIPE_BINARY (the built diffpipe); PIL from the pinned venv when present."""
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import zlib

from mpi_case import fail, mpirun, run, run_case

PROMPTS = ["a cat sipping a margarita", "un caf\u00e9 pr\u00e8s du phare \u732b"]


def generate_args(model, out, extra=()):
    args = ["generate", "--model", str(model), "--dtype", "fp32", "--height", "64", "--width", "96", "--steps", "3",
            "--seed", "11", "--guidance", "4.25", "--max-sequence-length", "32", "--out", str(out)]
    for p in PROMPTS:
        args += ["--prompt", p]
    return args + list(extra)


def png_text_by_walking(path):
    """The text chunks, read with struct and zlib only (independent of the C++ reader and of PIL)."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: no PNG signature")
    texts, offset = {}, 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        body = data[offset + 8:offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length:offset + 12 + length])
        if zlib.crc32(kind + body) & 0xffffffff != crc:
            fail(f"{path}: CRC mismatch in {kind}")
        if kind == b"tEXt":
            key, value = body.split(b"\0", 1)
            texts[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, rest = body.split(b"\0", 1)
            flag, _method = rest[0], rest[1]
            _language, _translated, value = rest[2:].split(b"\0", 2)
            texts[key.decode("latin-1")] = (zlib.decompress(value) if flag else value).decode("utf-8")
        offset += 12 + length
    return texts


def case_png_text(binary, model, tmp, ranks):
    out = tmp / "img.png"
    launch = mpirun(ranks) if ranks > 1 else []
    code, output, _ = run(launch + [binary] + generate_args(model, out, ["--num-images-per-prompt", "2"]))
    if code != 0:
        fail(f"generate exited {code}:\n{output}")
    expected_version = None
    for index in range(4):
        path = tmp / f"img-{index}.png"
        texts = png_text_by_walking(path)
        prompt = PROMPTS[index // 2]
        want = {"prompt": prompt, "seed": "11", "steps": "3", "guidance": "4.25", "size": "96x64", "width": "96",
                "height": "64", "model": str(model), "dtype": "fp32", "batch_index": str(index), "batch_size": "4"}
        for key, value in want.items():
            if texts.get(key) != value:
                fail(f"{path.name}: text chunk {key!r} is {texts.get(key)!r}, expected {value!r}")
        software = texts.get("Software", "")
        if not software.startswith("diffpipe "):
            fail(f"{path.name}: Software chunk {software!r}")
        expected_version = software
        parameters = texts.get("parameters", "")
        if not parameters.startswith(prompt + "\n") or "Seed: 11" not in parameters or "Steps: 3" not in parameters \
                or "Size: 96x64" not in parameters or software not in parameters:
            fail(f"{path.name}: parameters chunk {parameters!r}")
        try:
            from PIL import Image
        except ImportError:
            Image = None
        if Image is not None:
            with Image.open(path) as image:
                image.load()
                if image.text != texts:
                    fail(f"{path.name}: PIL reads {image.text}, the chunk walk {texts}")
        code, output, _ = run([binary, "inspect", str(path), "--json"])
        if code != 0:
            fail(f"inspect {path.name} exited {code}:\n{output}")
        if json.loads(output)["text"] != texts:
            fail(f"inspect {path.name} --json prints {output}, the chunk walk {texts}")
        code, output, _ = run([binary, "inspect", str(path)])
        if code != 0 or f"prompt: {prompt}" not in output or "seed: 11" not in output:
            fail(f"inspect {path.name} exited {code}:\n{output}")
    # A damaged text chunk: one flipped byte inside the prompt's chunk breaks its CRC.
    data = bytearray((tmp / "img-1.png").read_bytes())
    at = data.find(PROMPTS[0].encode())
    data[at] ^= 0x20
    damaged = tmp / "damaged.png"
    damaged.write_bytes(bytes(data))
    code, output, _ = run([binary, "inspect", str(damaged)])
    if code == 0 or str(damaged) not in output or "CRC mismatch" not in output:
        fail(f"inspect of a damaged PNG exited {code}:\n{output}")
    print(f"4 PNGs carry prompt, seed, steps, guidance, size, model and {expected_version}; PIL, a chunk walk and "
          f"inspect agree; a damaged chunk is refused")


def run_ranks(binary, model, tmp, ranks, name, extra, launcher_extra=()):
    out = tmp / f"{name}.png"
    code, output, seconds = run(mpirun(ranks) + list(launcher_extra) + [binary] + generate_args(model, out, extra))
    if code != 0:
        fail(f"{name}: {ranks} ranks exited {code}:\n{output}")
    return output, seconds


def report_json(binary, inputs):
    code, output, _ = run([binary, "report", "--json"] + [str(i) for i in inputs])
    if code != 0:
        fail(f"report --json {' '.join(map(str, inputs))} exited {code}:\n{output}")
    return json.loads(output)


def expect_refusal(binary, inputs, words):
    code, output, _ = run([binary, "report"] + [str(i) for i in inputs])
    if code == 0 or any(w not in output for w in words):
        fail(f"report {' '.join(map(str, inputs))} exited {code}, expected a refusal naming {words}:\n{output}")
    return output.strip().splitlines()[-1]


def case_report(binary, model, tmp, ranks):
    runs = tmp / "runs"
    runs.mkdir()
    run_ranks(binary, model, tmp, ranks, "a", ["--report", str(runs / "a.json"), "--microbatch-size", "1",
                                               "--max-memory", ",".join(f"{r}=1GB" for r in range(ranks))])
    files = [runs / f"a.rank{r}.json" for r in range(ranks)]
    docs = [json.loads(f.read_text()) for f in files]
    merged = report_json(binary, [runs])
    if len(merged["runs"]) != 1:
        fail(f"one run in {runs}, report found {len(merged['runs'])}")
    table = merged["runs"][0]
    if table["run_id"] != docs[0]["run_id"] or table["world_size"] != ranks or len(table["ranks"]) != ranks:
        fail(f"merged run {table['run_id']} of {table['world_size']} ranks, files say {docs[0]['run_id']}")
    if len({d["run_id"] for d in docs}) != 1 or not docs[0]["run_id"]:
        fail(f"the ranks' reports carry run ids {[d['run_id'] for d in docs]}: one shared id expected")
    for row, doc in zip(table["ranks"], docs):
        if abs(row["busy_seconds"] - doc["compute_seconds"]) > 1e-9 or \
                abs(row["transfer_seconds"] - doc["receive_seconds"] - doc["send_seconds"]) > 1e-9:
            fail(f"rank {doc['rank']}: merged {row} disagrees with its file")
        if row["memory_cap_bytes"] != 1_000_000_000 or row["peak_over_cap"] is not (row["peak_bytes"] > 1e9):
            fail(f"rank {doc['rank']}: cap {row['memory_cap_bytes']}, peak {row['peak_bytes']}, over {row['peak_over_cap']}")
    stage = [d for d in docs if d["blocks"] is not None]
    bubble = 1 - sum(d["compute_seconds"] for d in stage) / sum(d["denoise_wall_seconds"] for d in stage)
    if abs(table["bubble_share"] - bubble) > 1e-9 or not 0 <= bubble < 1:
        fail(f"bubble share {table['bubble_share']}, expected {bubble}")
    for link in table["links"]:
        if link["bytes"] != docs[link["from"]]["bytes_sent"] or link["received_by_peer"] != link["bytes"]:
            fail(f"link {link}: rank {link['from']} sent {docs[link['from']]['bytes_sent']}")
    code, text, _ = run([binary, "report", str(runs)])
    if code != 0 or "bubble:" not in text or f"run {table['run_id']}" not in text or "link 0 -> " not in text:
        fail(f"report {runs} exited {code}:\n{text}")
    print(text)
    # The same files named one by one are the same run.
    if report_json(binary, files)["runs"][0]["ranks"] != table["ranks"]:
        fail("report FILE... differs from report DIR")
    # A second run of the same request is another run: mixing its files with the first's is refused.
    run_ranks(binary, model, tmp, ranks, "b", ["--report", str(tmp / "b.json"), "--microbatch-size", "1",
                                               "--max-memory", ",".join(f"{r}=1GB" for r in range(ranks))])
    mixed = [files[0], files[1], tmp / "b.rank2.json"]
    print("mixed runs:", expect_refusal(binary, mixed, ["mixed runs", str(tmp / "b.rank2.json")]))
    # Another request (more steps) under the same name in one folder.
    other = tmp / "other"
    other.mkdir()
    for f in files[:2]:
        (other / f.name).write_text(f.read_text())
    doc = json.loads((tmp / "b.rank2.json").read_text())
    doc["run_id"] = docs[0]["run_id"]
    doc["request"] = doc["request"].replace("3 steps", "4 steps")
    (other / "a.rank2.json").write_text(json.dumps(doc))
    print("other request:", expect_refusal(binary, [other], ["mixed runs", "another request", "a.rank2.json"]))
    # A missing rank, a damaged file, a field of the wrong type, a rank out of range, not a report at all.
    (other / "a.rank2.json").unlink()
    print("missing rank:", expect_refusal(binary, [other], ["rank(s) 2", "missing"]))
    damaged = tmp / "damaged"
    damaged.mkdir()
    for f in files:
        (damaged / f.name).write_text(f.read_text())
    (damaged / "a.rank1.json").write_text(files[1].read_text()[:200])
    print("truncated:", expect_refusal(binary, [damaged], [str(damaged / "a.rank1.json")]))
    doc = json.loads(files[1].read_text())
    doc["compute_seconds"] = "fast"
    (damaged / "a.rank1.json").write_text(json.dumps(doc))
    print("wrong type:", expect_refusal(binary, [damaged], [str(damaged / "a.rank1.json"), "compute_seconds"]))
    doc = json.loads(files[1].read_text())
    doc["rank"] = 7
    (damaged / "a.rank1.json").write_text(json.dumps(doc))
    print("rank out of range:", expect_refusal(binary, [damaged], [str(damaged / "a.rank1.json"), "rank"]))
    (damaged / "a.rank1.json").write_text(json.dumps({"traceEvents": []}))
    print("not a report:", expect_refusal(binary, [damaged], [str(damaged / "a.rank1.json"), "not a diffpipe rank report"]))
    print(f"report merges {ranks} ranks' files and refuses mixed, damaged and incomplete inputs naming the file")


TRACK_NAMES = {1: "host", 2: "compute", 3: "send", 4: "receive", 5: "checkpoint", 8: "background load"}


def check_trace_schema(doc, path):
    """The trace-event format as viewers read it: required keys and types per phase, durations >= 0."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail(f"{path}: expected an object with a traceEvents list")
    for i, e in enumerate(doc["traceEvents"]):
        where = f"{path}: event {i} ({e.get('name')!r})"
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str) or not isinstance(e.get("name"), str):
            fail(f"{where}: needs a string ph and name")
        for key in ("pid", "tid"):
            if not isinstance(e.get(key), int) or isinstance(e.get(key), bool):
                fail(f"{where}: {key} must be an integer")
        if e["ph"] == "X":
            for key in ("ts", "dur"):
                if not isinstance(e.get(key), (int, float)) or isinstance(e.get(key), bool) or e[key] < 0:
                    fail(f"{where}: {key} must be a number >= 0, got {e.get(key)!r}")
            if "cat" in e and not isinstance(e["cat"], str):
                fail(f"{where}: cat must be a string")
        elif e["ph"] == "M":
            if e["name"] not in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"):
                fail(f"{where}: unknown metadata event")
            args = e.get("args")
            if not isinstance(args, dict):
                fail(f"{where}: metadata needs an args object")
            if e["name"].endswith("_name") and not isinstance(args.get("name"), str):
                fail(f"{where}: args.name must be a string")
            if e["name"].endswith("_sort_index") and not isinstance(args.get("sort_index"), int):
                fail(f"{where}: args.sort_index must be an integer")
        else:
            fail(f"{where}: phase {e['ph']!r} (this writer only writes X and M)")


def check_nesting(spans, path):
    """Complete events on one track must nest: each starts after the previous ends or ends within it."""
    by_track = {}
    for e in spans:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for (pid, tid), events in by_track.items():
        stack = []
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"]:
                fail(f"{path}: rank {pid} track {TRACK_NAMES.get(tid, tid)}: {e['name']!r} "
                     f"[{e['ts']}, {e['ts'] + e['dur']}] overlaps {stack[-1]['name']!r} "
                     f"[{stack[-1]['ts']}, {stack[-1]['ts'] + stack[-1]['dur']}] without nesting")
            stack.append(e)


# Ranks on one host share a clock; these skews (us, by rank) give them the unrelated clocks of separate hosts,
# seconds apart, which the trace's alignment must undo (core/trace_clock.h).
CLOCK_SKEWS_US = [0, 5_000_000, -3_000_000, 7_000_000]


def case_trace(binary, model, tmp, ranks):
    # Three ways the blocks load: staged, their warm-up after the load (the CPU's default); beside, the load on a
    # helper thread while the warm-up runs (CUDA's default, asked for here); overlap, rank 0's load and warm-up on
    # a thread while its encoders run (--load-overlap on). A load beside the host's work takes a track of its own.
    for mode in ("staged", "beside", "overlap"):
        check_trace(binary, model, tmp / mode, ranks, mode)


def check_trace(binary, model, tmp, ranks, mode):
    tmp.mkdir()
    trace = tmp / "trace.json"
    report = tmp / "report.json"
    skews = CLOCK_SKEWS_US[:ranks]
    os.environ["DIFFPIPE_TRACE_CLOCK_SKEW_US"] = ",".join(map(str, skews))
    os.environ["DIFFPIPE_WARM_UP_BESIDE_LOAD"] = "1" if mode == "beside" else "0"
    output, seconds = run_ranks(binary, model, tmp, ranks, "t", [
        "--trace", str(trace), "--report", str(report), "--microbatch-size", "1", "--num-images-per-prompt", "2",
        "--checkpoint-dir", str(tmp / "checkpoints"), "--checkpoint-every", "2"] +
        (["--load-overlap", "on"] if mode == "overlap" else []),
        launcher_extra=["-x", "DIFFPIPE_TRACE_CLOCK_SKEW_US", "-x", "DIFFPIPE_WARM_UP_BESIDE_LOAD"])
    if not trace.exists():
        fail(f"--trace {trace} was not written:\n{output}")
    doc = json.loads(trace.read_text())
    check_trace_schema(doc, trace)
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    check_nesting(spans, trace)
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    if sorted(process_names) != list(range(ranks)):
        fail(f"{trace}: process_name metadata for pids {sorted(process_names)}, expected one per rank 0..{ranks - 1}")
    thread_names = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in spans:
        if (e["pid"], e["tid"]) not in thread_names:
            fail(f"{trace}: span {e['name']!r} on rank {e['pid']} track {e['tid']} has no thread_name")
    reports = [json.loads((tmp / f"report.rank{r}.json").read_text()) for r in range(ranks)]
    for r in range(ranks):
        mine = [e for e in spans if e["pid"] == r]
        if not mine:
            fail(f"{trace}: rank {r} has no spans")
        names = [e["name"] for e in mine]
        compute = [e for e in mine if e["tid"] == 2]
        blocks = reports[r]["blocks"]
        expected = []
        if blocks is not None:
            expected += [f"loading blocks [{blocks[0]}, {blocks[1]})", f"blocks [{blocks[0]},{blocks[1]}) mb 0 step 1",
                         f"blocks [{blocks[0]},{blocks[1]}) mb 3 step 3"]
            loads = [e for e in mine if e["name"].startswith("loading blocks [")]
            warm_ups = [e for e in mine if e["name"] == "warming up the blocks"]
            # Only a rank that encodes overlaps its load with the encoders; the others load staged.
            mine_mode = "staged" if mode == "overlap" and r != 0 else mode
            load_track, warm_up_track = {"staged": (1, 1), "beside": (8, 1), "overlap": (8, 8)}[mine_mode]
            # Beside the load, the warm-up runs once for each zero-weight copy (the first and the last block).
            # Whether the two overlap in time on a tiny model is up to the threads: the tracks must allow it.
            if len(loads) != 1 or loads[0]["tid"] != load_track or not warm_ups or \
                    any(w["tid"] != warm_up_track for w in warm_ups):
                fail(f"{trace}: rank {r} ({mine_mode}) should have one block load on track {load_track} and its "
                     f"blocks' warm-up on track {warm_up_track}: {loads} {warm_ups}")
            if mine_mode != "beside" and (len(warm_ups) != 1 or warm_ups[0]["ts"] < loads[0]["ts"] + loads[0]["dur"]):
                fail(f"{trace}: rank {r} ({mine_mode}) should warm its blocks up once, after their load: "
                     f"{loads} {warm_ups}")
            # The trace's compute spans are the report's: the same count, the same clock (rounding to 1 us each).
            if len(compute) != reports[r]["microbatch_steps"]:
                fail(f"rank {r}: {len(compute)} compute spans, the report counts {reports[r]['microbatch_steps']} "
                     f"microbatch steps")
            total = sum(e["dur"] for e in compute) / 1e6
            if abs(total - reports[r]["compute_seconds"]) > 1e-6 * len(compute) + 1e-6:
                fail(f"rank {r}: compute spans sum to {total} s, the report says {reports[r]['compute_seconds']} s")
        if r == 0:
            expected += ["encode: CLIP forward", "encode: T5 forward", "decode mb 0", "decode mb 3",
                         "checkpoint copy step 2", "checkpoint write step 2", "send step mb 0 step 1 to rank 1"
                         if blocks is None else "send activations mb 0 step 1 to rank 1",
                         f"receive noise mb 0 step 1 from rank {ranks - 1}"]
            # The VAE loads on a thread of its own while denoising goes on, and before the first decode.
            vae = [e for e in mine if e["name"] == "VAE load"]
            ring = [e for e in mine if e["tid"] in (2, 3, 4)]
            first_decode = min(e["ts"] for e in mine if e["name"].startswith("decode mb "))
            if len(vae) != 1 or vae[0]["tid"] != 8:
                fail(f"{trace}: rank 0 should have one 'VAE load' span on the background load track (8): {vae}")
            if not (vae[0]["ts"] < max(e["ts"] + e["dur"] for e in ring) and
                    vae[0]["ts"] + vae[0]["dur"] <= first_decode + 1):
                fail(f"{trace}: the VAE load [{vae[0]['ts']}, {vae[0]['ts'] + vae[0]['dur']}] does not overlap "
                     f"denoising or ends after the first decode ({first_decode})")
        else:
            expected += [f"receive {'activations' if r > 1 or reports[0]['blocks'] is not None else 'step'} mb 0 step 1 "
                         f"from rank {r - 1}",
                         f"send {'noise' if r == ranks - 1 else 'activations'} mb 0 step 1 to rank "
                         f"{0 if r == ranks - 1 else r + 1}"]
        for name in expected:
            if not any(n == name or n.startswith(name + " ") for n in names):
                fail(f"{trace}: rank {r} has no span named {name!r}; it has {sorted(set(names))[:40]}")
    # Causality across ranks, which only holds once the clocks are aligned: a message is received after it
    # started to be sent (to within the alignment's error, half a round trip, plus a microsecond of rounding).
    rtt = {a["rank"]: a["round_trip_us"] for a in doc["otherData"]["clock_alignment"]}
    for a in doc["otherData"]["clock_alignment"]:
        if abs(a["offset_us"] - skews[a["rank"]]) > a["round_trip_us"] / 2 + 1:
            fail(f"{trace}: rank {a['rank']}'s clock offset measured {a['offset_us']:.1f} us, its clock is skewed "
                 f"{skews[a['rank']]} us (round trip {a['round_trip_us']:.1f} us)")
    sends = {}
    for e in spans:
        if e["tid"] == 3:
            parts = e["name"].split()
            sends[(e["pid"], " ".join(parts[1:-3]), int(parts[-1]))] = e
    checked = 0
    for e in spans:
        if e["tid"] != 4:
            continue
        parts = e["name"].split()
        sender = int(parts[-1])
        send = sends.get((sender, " ".join(parts[1:-3]), e["pid"]))
        if send is None:
            continue
        slack = (rtt.get(sender, 0) + rtt.get(e["pid"], 0)) / 2 + 2
        if e["ts"] + e["dur"] + slack < send["ts"]:
            fail(f"{trace}: rank {e['pid']} finished receiving {e['name']!r} at {e['ts'] + e['dur']} us, before rank "
                 f"{sender} began sending it at {send['ts']} us: the clocks are not aligned")
        checked += 1
    if checked < 4 * 3:
        fail(f"{trace}: only {checked} messages matched between send and receive spans")
    print(f"{trace.name}, blocks loaded {mode}: {len(spans)} spans over {ranks} ranks pass the schema and nesting "
          f"checks; "
          f"{checked} messages causal across ranks; run took {seconds:.1f} s")
    picture = os.environ.get("DIFFPIPE_TRACE_PICTURE")
    if picture and mode == "staged":  # the picture shows the CPU's default
        shutil.copy(trace, picture)
        print(f"copied the trace to {picture}")


def case_torch_profile(binary, model, tmp, ranks):
    import h5py  # the pinned venv's, as the other latents checks use
    import numpy as np

    def latents(path):
        with h5py.File(path, "r") as f:
            return np.asarray(f["latents"])

    # One microbatch of both images: its whole steps end one at a time, so the profile stops between two.
    def generate(name, extra):
        out = tmp / f"{name}.h5"
        extra = list(extra) + ["--output-type", "latent", "--microbatch-size", "2"]
        code, output, _ = run(mpirun(ranks) + [binary] + generate_args(model, out, extra))
        return code, output, out

    code, output, plain = generate("plain", [])
    if code != 0:
        fail(f"{ranks} ranks without --torch-profile exited {code}:\n{output}")
    step_name = re.compile(r"^blocks \[(\d+),(\d+)\) mb (\d+) step (\d+)$")
    for asked, recorded in ((2, {1, 2}), (10, {1, 2, 3})):
        profile = tmp / f"profile-{asked}.json"
        code, output, out = generate(f"profiled-{asked}", ["--torch-profile", str(profile),
                                                          "--torch-profile-steps", str(asked)])
        if code != 0:
            fail(f"{ranks} ranks with --torch-profile exited {code}:\n{output}")
        if not np.array_equal(latents(out), latents(plain)):
            fail("--torch-profile changed the latents")
        if f"wrote --torch-profile {profile}" not in output:
            fail(f"no line says the profile was written:\n{output}")
        events = json.loads(profile.read_text())["traceEvents"]
        spans = [e for e in events if e.get("cat") == "user_annotation"]
        steps = {int(step_name.match(e["name"]).group(4)) for e in spans if step_name.match(e["name"])}
        if steps != recorded:
            fail(f"{profile}: compute spans of steps {sorted(steps)}, expected {sorted(recorded)}")
        if not any(e.get("cat") == "cpu_op" and e.get("name", "").startswith("aten::") for e in events):
            fail(f"{profile}: no ATen op recorded")
        read = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve().parents[2] /
                                                   "bench/first_step_trace.py"), str(profile), "--steps", "1"],
                              capture_output=True, text=True, timeout=120)
        if read.returncode != 0 or "step 1" not in read.stdout:
            fail(f"bench/first_step_trace.py on {profile} exited {read.returncode}:\n{read.stdout}{read.stderr}")
        print(f"--torch-profile-steps {asked}: steps {sorted(steps)} of rank 0 recorded, {len(events)} events, "
              f"latents bit-identical")
    missing = tmp / "no-such-folder" / "profile.json"
    code, output, _ = generate("refused", ["--torch-profile", str(missing)])
    if code == 0 or "--torch-profile" not in output or "does not exist" not in output:
        fail(f"--torch-profile into a missing folder exited {code}, expected a refusal naming the option:\n{output}")
    if "load " in output:
        fail(f"--torch-profile into a missing folder was refused only after loading:\n{output}")


CASES = {"png-text": case_png_text, "report": case_report, "trace": case_trace, "torch-profile": case_torch_profile}


if __name__ == "__main__":
    run_case(CASES, "diffpipe-observe", default_ranks=3, mpirun_for_one_rank=False)
