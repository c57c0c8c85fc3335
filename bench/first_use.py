"""What a fresh process pays on first use of the GPU, op by op, and what its exit costs (GPU machine, LibTorch's
own Python build of the same torch version as diffpipe links).

Each scenario runs in a process of its own, so every first use is a real first use:
  ops       the first call of each op of a CLIP-L forward at FLUX's shapes (bf16), in order, then the same op again;
  sdpa      the first causal attention at CLIP's shape under each backend, one process per backend;
  threads   an op first used on a helper thread, then on the main thread (what a warm-up thread can save);
  lazy      eight ops of distinct kernels first used one after another, then (another process) each on a thread
            of its own, all at once: whether the driver's lazy module loading runs in parallel; and the
            context's creation under CUDA_MODULE_LOADING=EAGER (what loading every module up front costs);
  exit      a child's wall from start to exit as the parent sees it, holding nothing, 26.7 GB on the device, and
            that plus 256 MB of pinned host memory (diffpipe's loader staging), and (--mapped-folder) every page
            of a folder's safetensors files mapped in, ending with os._exit.
    python3 bench/first_use.py [--json FILE] [--mapped-folder DIR]
Figures only: nothing here passes or fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r'''
import json, sys, threading, time
import torch
import torch.nn.functional as F
scenario = sys.argv[1]
out = {}
def timed(name, fn):
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    out[name] = time.perf_counter() - started
started = time.perf_counter()
torch.cuda.init()
torch.zeros(1, device="cuda")
out["context"] = time.perf_counter() - started
bf16 = dict(device="cuda", dtype=torch.bfloat16)
x = torch.zeros(1, 77, 768, **bf16)
w = torch.zeros(768, 768, **bf16)
b = torch.zeros(768, **bf16)
q = torch.zeros(1, 12, 77, 64, **bf16)
if scenario == "ops":
    ops = [
        ("pinned 8 MB x 32", lambda: [torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True) for _ in range(32)]),
        ("embedding", lambda: F.embedding(torch.zeros(1, 77, dtype=torch.long, device="cuda"), torch.zeros(10, 768, **bf16))),
        ("layer_norm", lambda: F.layer_norm(x, (768,), b, b)),
        ("linear (cuBLASLt, bias)", lambda: F.linear(x, w, b)),
        ("linear 768->3072", lambda: F.linear(x, torch.zeros(3072, 768, **bf16), torch.zeros(3072, **bf16))),
        ("sdpa causal (default backend)", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)),
        ("quick_gelu", lambda: x * torch.sigmoid(1.702 * x)),
        ("argmax + index_select", lambda: x.reshape(77, 768).index_select(0, torch.zeros(77, dtype=torch.long, device="cuda").argmax(-1, keepdim=True))),
        ("T5 linear 4096 no bias", lambda: F.linear(torch.zeros(1, 512, 4096, **bf16), torch.zeros(4096, 4096, **bf16))),
        ("sdpa 512 with bias (T5)", lambda: F.scaled_dot_product_attention(torch.zeros(1, 64, 512, 64, **bf16), torch.zeros(1, 64, 512, 64, **bf16), torch.zeros(1, 64, 512, 64, **bf16), attn_mask=torch.zeros(1, 64, 512, 512, **bf16))),
        ("sdpa FLUX 4608x24x128", lambda: F.scaled_dot_product_attention(torch.zeros(1, 24, 4608, 128, **bf16), torch.zeros(1, 24, 4608, 128, **bf16), torch.zeros(1, 24, 4608, 128, **bf16))),
        ("conv2d 3x3 (VAE)", lambda: F.conv2d(torch.zeros(1, 512, 128, 128, **bf16), torch.zeros(512, 512, 3, 3, **bf16), padding=1)),
    ]
    for name, fn in ops:
        timed(name, fn)
        timed(name + " (again)", fn)
elif scenario.startswith("sdpa:"):
    backend = scenario.split(":", 1)[1]
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(getattr(SDPBackend, backend)):
        timed("first", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
        timed("again", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
elif scenario == "threads":
    flux_q = torch.zeros(1, 24, 4608, 128, **bf16)
    for name, fn in [("linear", lambda: F.linear(x, w, b)),
                     ("sdpa causal", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)),
                     ("sdpa FLUX shape", lambda: F.scaled_dot_product_attention(flux_q, flux_q, flux_q)),
                     ("layer_norm", lambda: F.layer_norm(x, (768,), b, b)),
                     ("conv2d 3x3 (VAE)", lambda: F.conv2d(torch.zeros(1, 256, 256, 256, **bf16),
                                                            torch.zeros(256, 256, 3, 3, **bf16), padding=1))]:
        helper = threading.Thread(target=lambda: timed(name + " on a helper thread", fn))
        helper.start(); helper.join()
        timed(name + " then on the main thread", fn)
elif scenario.startswith("lazy:"):
    # Distinct kernels from distinct translation units of libtorch_cuda, none used above.
    idx = torch.zeros(77, dtype=torch.long, device="cuda")
    ops = [("layer_norm", lambda: F.layer_norm(x, (768,), b, b)),
           ("sigmoid", lambda: torch.sigmoid(x)),
           ("embedding", lambda: F.embedding(idx, w)),
           ("argmax", lambda: x.argmax(-1)),
           ("cumsum", lambda: x.float().cumsum(-1)),
           ("softmax", lambda: torch.softmax(x, -1)),
           ("gelu tanh", lambda: F.gelu(x, approximate="tanh")),
           ("sort", lambda: torch.sort(x, -1))]
    started = time.perf_counter()
    if scenario == "lazy:threads":
        helpers = [threading.Thread(target=fn) for _, fn in ops]
        for h in helpers: h.start()
        for h in helpers: h.join()
    else:
        for _, fn in ops: fn()
    torch.cuda.synchronize()
    out["eight first uses (" + scenario.split(":")[1] + ")"] = time.perf_counter() - started
elif scenario.startswith("exit:"):
    holding = scenario.split(":", 1)[1]
    if holding in ("device", "device+pinned"):
        blocks = [torch.empty(int(26.7e9) // 8, dtype=torch.uint8, device="cuda") for _ in range(8)]
    if holding == "device+pinned":
        pinned = [torch.empty(8 << 20, dtype=torch.uint8, pin_memory=True) for _ in range(32)]
    if holding == "mapped":
        # Every page of the folder's safetensors files mapped in, as a loader copying out of mmap leaves them.
        import numpy
        maps = [numpy.memmap(f, dtype=numpy.uint8, mode="r") for f in sys.argv[2].split(",")]
        out["mapped"] = f"{sum(m.size for m in maps) / 1e9:.1f} GB in {len(maps)} files"
        for m in maps:
            int(m[::4096].sum())
    torch.cuda.synchronize()
    out["exit_at"] = time.time()  # the parent subtracts this from the moment it sees the child gone
print("RESULT " + json.dumps(out), flush=True)
if scenario.startswith("exit:"):
    import os
    os._exit(0)
'''


def run(scenario: str, *more: str, env: dict = None) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, scenario, *more], capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})
    wall = time.perf_counter() - started
    ended = time.time()
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr or done.stdout)[-600:], "wall": wall}
    result = json.loads(line[len("RESULT "):])
    result["wall"] = wall
    if "exit_at" in result:
        result["exit (child's last line to its end)"] = ended - result.pop("exit_at")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--mapped-folder", help="also exit holding every page of this folder's safetensors mapped")
    args = parser.parse_args()
    results = {}
    results["ops"] = run("ops")
    for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        results["sdpa:" + backend] = run("sdpa:" + backend)
    results["threads"] = run("threads")
    for order in ("sequential", "threads"):
        results["lazy:" + order] = run("lazy:" + order)
    results["lazy:sequential, CUDA_MODULE_LOADING=EAGER"] = run("lazy:sequential", env={"CUDA_MODULE_LOADING": "EAGER"})
    for holding in ("nothing", "device", "device+pinned"):
        results["exit:" + holding] = run("exit:" + holding)
    if args.mapped_folder:
        import glob
        files = sorted(glob.glob(f"{args.mapped_folder}/**/*.safetensors", recursive=True))
        results["exit:mapped"] = run("exit:mapped", ",".join(files))
    for scenario, figures in results.items():
        print(f"\n{scenario}")
        for name, value in figures.items():
            print(f"  {name:44}{value * 1000:10.1f} ms" if isinstance(value, float) else f"  {name}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
