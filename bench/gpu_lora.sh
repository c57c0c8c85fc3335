#!/usr/bin/env bash
# LoRA on one GPU at full size: a random FLUX.1-dev transformer (make-random, bf16) and a random rank-64 adapter on
# every Linear of it (make-random --lora-rank 64, 0.69 GB), 1024x1024 with 512 text tokens, bf16:
#   the step without an adapter, with it fused (merged into the weights as each block loads), and unfused (the
#   low-rank path in the forward); the load time of each (the fused one includes reading and merging the adapter).
# Prints the figures side by side; logs and a JSON summary go to $OUT.
#   bash bench/gpu_lora.sh            (REPEAT=10 timed steps after WARMUP=2 by default; MODEL=DIR reuses a folder)
# About 3 minutes of GPU time after the build: writing the 23.8 GB folder is the longest part.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
mkdir -p "$out"
started=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - started )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > "$out/lora-build.log" 2>&1
cat "$out/lora-build.log"
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$here" -B "$here/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DDIFFPIPE_PYTHON="$(command -v python3)" >> "$out/lora-build.log" 2>&1 || { tail -30 "$out/lora-build.log"; exit 1; }
ninja -C "$here/build-gpu" diffpipe_cli >> "$out/lora-build.log" 2>&1 || { tail -40 "$out/lora-build.log"; exit 1; }
elapsed "built diffpipe"
bin="$here/build-gpu/diffpipe"

model=${MODEL:-/tmp/flux-dev-transformer}
if [ ! -f "$model/model_index.json" ]; then  # written last: its presence means the folder is complete
  "$bin" make-random --arch flux-dev --dtype bf16 --force --out "$model" 2>&1 | grep -v "\[info\]" | tee "$out/lora-make.log"
  [ -f "$model/model_index.json" ] || { echo "make-random failed"; exit 1; }
  elapsed "wrote $model"
fi
lora=${LORA:-/tmp/flux-dev-lora-r64.safetensors}
if [ ! -f "$lora" ]; then
  "$bin" make-random --arch flux-dev --dtype bf16 --lora-rank 64 --out "$lora" 2>&1 | grep -v "\[info\]" | tee -a "$out/lora-make.log"
  elapsed "wrote $lora"
fi
"$bin" inspect --lora "$lora" --model "$model" --json > "$out/lora-inspect.json" 2>&1 || { tail -5 "$out/lora-inspect.json"; exit 1; }

# Warm the page cache once so that the three loads below compare the same thing (the folder from memory).
cat "$model"/transformer/*.safetensors "$lora" > /dev/null
common=(forward --model "$model" --device cuda --dtype bf16 --height 1024 --width 1024 --text-len 512
        --repeat "${REPEAT:-10}" --warmup "${WARMUP:-2}")
status=0
for run in none fused unfused; do
  extra=()
  [ "$run" != none ] && extra=(--lora "$lora" --lora-mode "$run")
  "$bin" "${common[@]}" "${extra[@]}" > "$out/lora-$run.log" 2>&1 || { status=1; tail -20 "$out/lora-$run.log"; }
  elapsed "forward, adapter: $run"
done

python3 - "$out" <<'EOF'
import json, re, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {}
for run in ("none", "fused", "unfused"):
    text = (out / f"lora-{run}.log").read_text()
    load = re.search(r"^load: ([0-9.]+) ms", text, re.M)
    step = re.search(r"forward: mean ([0-9.]+) ms, best ([0-9.]+) ms", text)
    peak = re.search(r"peak during forwards ([0-9.]+) GB", text)
    output = re.search(r"output .* mean (\S+) std (\S+)", text)
    rows[run] = dict(load_s=float(load.group(1)) / 1e3 if load else None,
                     step_mean_ms=float(step.group(1)) if step else None,
                     step_best_ms=float(step.group(2)) if step else None,
                     peak_gb=float(peak.group(1)) if peak else None,
                     output_mean=float(output.group(1)) if output else None,
                     output_std=float(output.group(2)) if output else None)
base = rows["none"]["step_mean_ms"]
print(f"\nFLUX.1-dev, 1024x1024, 512 text tokens, bf16, one GPU; rank-64 LoRA on every Linear (random)")
print(f"{'adapter':10s} {'load s':>8s} {'step mean ms':>13s} {'best ms':>9s} {'vs none':>8s} {'peak GB':>8s}"
      f" {'output mean':>12s} {'output std':>11s}")
for run, r in rows.items():
    ratio = f"{r['step_mean_ms'] / base:.3f}" if base and r["step_mean_ms"] else "-"
    fmt = lambda v, spec: format(v, spec) if v is not None else "-"
    print(f"{run:10s} {fmt(r['load_s'], '8.2f')} {fmt(r['step_mean_ms'], '13.2f')} {fmt(r['step_best_ms'], '9.2f')} "
          f"{ratio:>8s} {fmt(r['peak_gb'], '8.2f')} {fmt(r['output_mean'], '12.5f')} {fmt(r['output_std'], '11.5f')}")
print("(fused and unfused compute the same adapter: their outputs' mean and std agree to bf16 rounding)")
(out / "lora-bench.json").write_text(json.dumps(rows, indent=2))
EOF
elapsed "done"
exit $status
