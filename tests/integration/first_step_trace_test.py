"""bench/first_step_trace.py on a small SQLite file laid out as Nsight Systems exports one, and on the same run as
LibTorch's profiler writes it: the step windows come from the NVTX ranges or annotations (step 1's from the
"denoising" range or the profile's start), kernels are counted in the window they start in, the main stream's idle
time is the gap between its kernels, what step 1 has more of (a long API call, an extra kernel) leads the
differences, and the last window's kernel time is summed by family. No GPU and no nsys needed; exits non-zero on the first wrong figure."""
import json
import pathlib
import sqlite3
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
MS = 1_000_000  # nanoseconds


def write_export(path: pathlib.Path):
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS(start INTEGER, end INTEGER, text TEXT, textId INTEGER, eventType INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INTEGER, end INTEGER, streamId INTEGER, shortName INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME(start INTEGER, end INTEGER, nameId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY(start INTEGER, end INTEGER);
    """)
    names = {1: "gemm", 2: "euler_step", 3: "cudaLaunchKernel", 4: "cuLibraryLoadData",
             5: "blocks [0,57) mb 0 step 2"}
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", names.items())
    # The loop from 0 to 300 ms; steps' compute ranges start at 5, 110 and 210 ms (one name through textId).
    db.executemany("INSERT INTO NVTX_EVENTS(start, end, text, textId) VALUES (?, ?, ?, ?)", [
        (0, 300 * MS, "denoising", None),
        (5 * MS, 100 * MS, "blocks [0,57) mb 0 step 1", None),
        (110 * MS, 200 * MS, None, 5),
        (210 * MS, 300 * MS, "blocks [0,57) mb 0 step 3", None),
        (20 * MS, 30 * MS, "blocks [0,57) mb 1 step 2", None),  # another microbatch's range: ignored
    ])
    kernels = [
        (6, 50, 7, 1), (60, 100, 7, 1), (101, 102, 7, 2),  # step 1: a 10 ms gap waiting for a kernel to load
        (111, 155, 7, 1), (155, 200, 7, 1), (201, 202, 7, 2),  # step 2: back to back
        (211, 250, 7, 1), (250, 290, 9, 1),  # step 3: one kernel on another stream
    ]
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?)",
                   [(s * MS, e * MS, stream, name) for s, e, stream, name in kernels])
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?)", [
        (5 * MS, 6 * MS, 3), (49 * MS, 59 * MS, 4), (59 * MS, 60 * MS, 3), (100 * MS, 101 * MS, 3),
        (110 * MS, 111 * MS, 3), (150 * MS, 151 * MS, 3), (200 * MS, 201 * MS, 3),
    ])
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?)", (2 * MS, 4 * MS))
    db.commit()
    db.close()


def write_kineto(path: pathlib.Path):
    """The same run as LibTorch's profiler writes it (`generate --torch-profile`): microseconds, categories, the
    stream in args, no "denoising" range (the profile itself starts the loop's window)."""
    def span(cat, name, start_ms, end_ms, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": start_ms * 1000.0, "dur": (end_ms - start_ms) * 1000.0,
                "pid": 0, "tid": 0, "args": args}
    events = [span("cpu_op", "aten::zeros", 0, 1)]
    events += [span("user_annotation", f"blocks [0,57) mb 0 step {s}", start, start + 90)
               for s, start in ((1, 5), (2, 110), (3, 210))]
    kernels = [(6, 50, 7, "gemm"), (60, 100, 7, "gemm"), (101, 102, 7, "euler_step"), (111, 155, 7, "gemm"),
               (155, 200, 7, "gemm"), (201, 202, 7, "euler_step"), (211, 250, 7, "gemm")]
    events += [span("kernel", name, s, e, stream=stream) for s, e, stream, name in kernels]
    events += [span("cuda_runtime", "cudaLaunchKernel", s, s + 1) for s in (5, 59, 100, 110, 150, 200)]
    events += [span("cuda_driver", "cuLibraryLoadData", 49, 59), span("gpu_memcpy", "Memcpy HtoD", 2, 4)]
    events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "diffpipe"}})
    path.write_text(json.dumps({"traceEvents": events}))


def check(condition, what, output):
    if not condition:
        print(f"FAIL: {what}\n{output}")
        sys.exit(1)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        export, figures_path = pathlib.Path(tmp) / "run.sqlite", pathlib.Path(tmp) / "figures.json"
        write_export(export)
        done = subprocess.run([sys.executable, str(ROOT / "bench/first_step_trace.py"), str(export), "--steps", "2",
                               "--json", str(figures_path)], capture_output=True, text=True, timeout=60)
        output = done.stdout + done.stderr
        check(done.returncode == 0, f"exit {done.returncode}", output)
        figures = json.loads(figures_path.read_text())
        check(list(figures) == ["step 1", "step 2"], f"windows {list(figures)}", output)
        one, two = figures["step 1"], figures["step 2"]
        check(abs(one["host_ms"] - 110) < 1e-9 and abs(two["host_ms"] - 100) < 1e-9,
              f"host times {one['host_ms']} / {two['host_ms']} (110 / 100 expected)", output)
        check(one["kernels"] == 3 and two["kernels"] == 3, "kernels counted where they start", output)
        check(abs(one["main_stream_idle_ms"] - 11) < 1e-9 and abs(two["main_stream_idle_ms"] - 1) < 1e-9,
              f"idle {one['main_stream_idle_ms']} / {two['main_stream_idle_ms']} (11 / 1 expected)", output)
        check(abs(one["before_first_kernel_ms"] - 6) < 1e-9, "lead time before step 1's first kernel", output)
        check(one["copies"] == 1 and two["copies"] == 0, "copies counted in their window", output)
        check(one["per_call"]["cuLibraryLoadData"]["count"] == 1, "the module load is among step 1's calls", output)
        calls = output.split("CUDA API calls on the host")[1].splitlines()
        check("cuLibraryLoadData" in calls[1], "the module load leads step 1's API differences", output)
        kernels = output.split("kernels, step 1 against step 2")[1].splitlines()
        check("gemm" in kernels[1], "the GEMM time leads the kernel differences", output)
        # The last window's families: step 2's two GEMMs (44 + 45 ms) and the Euler step (1 ms) as "other".
        family = two.get("families", {})
        check(list(family) == ["GEMM", "other"] and family["GEMM"]["count"] == 2 and
              abs(family["GEMM"]["ms"] - 89) < 1e-9 and abs(family["other"]["ms"] - 1) < 1e-9,
              f"step 2's kernel families {family}", output)
        check("kernel time by family, step 2" in output, "the family table is printed", output)
        # The same run from LibTorch's profiler: the same windows and figures.
        profile, profile_figures = pathlib.Path(tmp) / "profile.json", pathlib.Path(tmp) / "profile-figures.json"
        write_kineto(profile)
        done = subprocess.run([sys.executable, str(ROOT / "bench/first_step_trace.py"), str(profile), "--steps", "2",
                               "--json", str(profile_figures)], capture_output=True, text=True, timeout=60)
        check(done.returncode == 0, f"the profile: exit {done.returncode}", done.stdout + done.stderr)
        from_profile = json.loads(profile_figures.read_text())
        for key in ("host_ms", "kernels", "main_stream_idle_ms", "before_first_kernel_ms", "copies"):
            for step in ("step 1", "step 2"):
                check(abs(from_profile[step][key] - figures[step][key]) < 1e-6,
                      f"the profile's {step} {key} {from_profile[step][key]} against {figures[step][key]}",
                      done.stdout)
        check(from_profile["step 1"]["per_call"]["cuLibraryLoadData"]["count"] == 1,
              "the profile's module load is among step 1's calls", done.stdout)
        # No step ranges: a clear refusal, not a traceback.
        db = sqlite3.connect(export)
        db.execute("DELETE FROM NVTX_EVENTS")
        db.commit()
        db.close()
        refused = subprocess.run([sys.executable, str(ROOT / "bench/first_step_trace.py"), str(export)],
                                 capture_output=True, text=True, timeout=60)
        check(refused.returncode != 0 and "no 'denoising' range" in refused.stderr and
              "Traceback" not in refused.stderr, "an export without NVTX ranges is refused", refused.stderr)
    print("first_step_trace: windows, idle time, copies and step 1's differences as constructed")


if __name__ == "__main__":
    main()
