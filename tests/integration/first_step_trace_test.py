"""bench/first_step_trace.py on a small SQLite file laid out as Nsight Systems exports one: the step windows come
from the NVTX ranges (step 1's from the "denoising" range), kernels are counted in the window they start in, the
main stream's idle time is the gap between its kernels, and what step 1 has more of (a long API call, an extra
kernel) leads the differences. No GPU and no nsys needed; exits non-zero on the first wrong figure."""
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
