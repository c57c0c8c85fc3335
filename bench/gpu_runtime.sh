#!/usr/bin/env bash
# One call on the GPU machine: the multi-rank runtime on CUDA with ranks sharing the one H200 over the MPI
# transport (host-staged).
#   1. the tiny pipeline, fp32 on cuda: 1, 2 and 3 ranks must give bit-identical packed latents;
#   2. FLUX.1-dev architecture at full size (random weights, make-random --pipeline, bf16): one rank, then
#      two ranks each capped at 16 GB with the transformer split by "auto" and by "pipeline", --report per rank.
#   3. offloaded blocks (issue 14 item 6): full size, 2 ranks, 4 steps (OFFLOAD_STEPS), the transformer split by
#      "auto" with GPUs too small for it, so that its last blocks go to cpu (and disk): latents against one
#      rank, each rank's peak device memory against its cap, ms/step and the copy time of the streamed blocks.
#      OFFLOAD_ONLY=1 runs only this section (after the build).
# Results (logs, per-rank reports, latents) go to $OUT. STEPS (default 8), HEIGHT/WIDTH (768x1360).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=${STEPS:-8} height=${HEIGHT:-768} width=${WIDTH:-1360}
started=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - started )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv
# h5py travels as a wheel in .whl/ (bench/fetch_wheels.sh); the image has no h5dump.
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$here"/.whl/h5py-*.whl 2>/dev/null
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
same_latents() {  # FILE_A FILE_B: exit 0 when bit-identical; prints the difference otherwise
  python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a = np.asarray(h5py.File(sys.argv[1])["latents"]); b = np.asarray(h5py.File(sys.argv[2])["latents"])
if a.shape == b.shape and np.array_equal(a, b):
    sys.exit(0)
print(f"  shapes {a.shape} {b.shape}, max difference {np.abs(a - b).max() / np.abs(a).max():.3g} of the scale"
      if a.shape == b.shape else f"  shapes {a.shape} {b.shape}")
sys.exit(1)
PY
}
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$here" -B "$here/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DDIFFPIPE_BUILD_TESTS=OFF > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
ninja -C "$here/build-gpu" diffpipe_cli >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
bin="$here/build-gpu/diffpipe"
elapsed "built"
status=0

# 3. Offloaded blocks. accelerate's "auto" fills every GPU to its max_memory with weights, then cpu, then disk;
# the runtime runs the offloaded blocks on the GPU rank whose range they continue (the last one) and streams
# them in per use. On CUDA under caps it plans auto with each GPU's budget less the activations, the allocator
# reserve and two streamed blocks (plan --cuda-caps), so 3a runs the brief's literal case. 3b and 3c run
# accelerate's own offloading maps (saved by `plan --json`: cpu only, then cpu and disk) with caps that leave
# rank 1 room for two streamed blocks and the activations.
offload_section() {
  local osteps=${OFFLOAD_STEPS:-4} model="$out/flux-dev"
  if [ ! -f "$model/model_index.json" ]; then
    "$bin" make-random --arch flux-dev --pipeline --out "$model" > "$out/make-random.log" 2>&1 || { tail -5 "$out/make-random.log"; return 1; }
  fi
  local args=(generate --model "$model" --prompt "a cat holding a sign that says hello world" --height "$height"
    --width "$width" --steps "$osteps" --guidance 3.5 --dtype bf16 --device cuda --output-type latent)
  "$bin" "${args[@]}" --out "$out/offload-ref.h5" --report "$out/offload-ref.json" > "$out/offload-ref.log" 2>&1 \
    || { tail -8 "$out/offload-ref.log"; return 1; }
  echo "offload reference, 1 rank, every block resident: $(grep -E 'ms/step' "$out/offload-ref.log" | tail -1 | cut -c1-160)"
  elapsed "offload reference"
  save_map() {  # MAX_MEMORY FILE: auto's hf_device_map for these budgets
    "$bin" plan --model "$model" --device-map auto --max-memory "$1" --height "$height" --width "$width" \
      --dtype bf16 --json 2>/dev/null | python3 -c 'import json, sys; t = sys.stdin.read(); print(json.dumps(json.loads(t[t.index("{"):])["hf_device_map"]))' > "$2"
  }
  local ostatus=0 name map caps
  save_map 0=12GB,1=8GB,cpu=64GB "$out/offload-cpu.json"
  save_map 0=12GB,1=8GB,cpu=2GB "$out/offload-disk.json"
  for run in "a:auto:0=12GB,1=8GB,cpu=64GB" "b:$out/offload-cpu.json:0=12GB,1=10GB" "c:$out/offload-disk.json:0=12GB,1=10GB"; do
    name=${run%%:*}; map=${run#*:}; caps=${map##*:}; map=${map%:*}
    mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${args[@]}" --device-map "$map" --max-memory "$caps" \
      --out "$out/offload-$name.h5" --report "$out/offload-$name-report.json" > "$out/offload-$name.log" 2>&1
    local rc=$?
    echo "3$name: --device-map $(basename "$map") --max-memory $caps: exit $rc"
    grep -E "runtime: ring|capped|loaded blocks|offloaded block|ms/step|ran out of device memory|failed" "$out/offload-$name.log" \
      | sed -E 's/; hf_device_map .*//' | cut -c1-260 | tail -9
    for r in 0 1; do
      [ -f "$out/offload-$name-report.rank$r.json" ] && python3 - "$out/offload-$name-report.rank$r.json" "$caps" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
caps = dict(item.split("=") for item in sys.argv[2].split(","))
cap = float(caps[str(doc["rank"])].rstrip("GB")) * 1e9
peak, reserved = doc["peak_device_bytes"], doc.get("peak_device_reserved_bytes", 0)
print(f"  rank {doc['rank']}: peak allocated {peak / 1e9:.2f} GB, peak reserved {reserved / 1e9:.2f} GB, cap {cap / 1e9:.0f} GB:"
      f" {'under' if reserved <= cap else 'OVER'} the cap; compute {doc['compute_seconds']:.2f} s, load {doc['load_seconds']:.2f} s")
if doc.get("offload_copies"):
    print(f"    {doc['offloaded_blocks']} offloaded blocks: {doc['offload_copies']} copies, {doc['offload_bytes'] / 1e9:.2f} GB,"
          f" {doc['offload_copy_seconds']:.3f} s of copies ({doc['offload_bytes'] / 1e9 / max(doc['offload_copy_seconds'], 1e-9):.1f} GB/s),"
          f" {doc['offload_pinned_host_bytes'] / 1e9:.2f} GB pinned")
PY
    done
    if [ $rc -eq 0 ]; then
      if same_latents "$out/offload-ref.h5" "$out/offload-$name.h5"; then
        echo "  latents bit-identical to 1 rank with every block resident"
      else
        echo "  latents DIFFER from 1 rank"; ostatus=1
      fi
    else
      ostatus=1
    fi
    elapsed "offload run 3$name"
  done
  return $ostatus
}
if [ "${OFFLOAD_ONLY:-0}" = 1 ]; then
  offload_section; exit $?
fi

# 1. Tiny pipeline on CUDA, fp32: ranks must not change the result.
tiny="$out/tiny"; rm -rf "$tiny"; "$bin" make-tiny --out "$tiny" > /dev/null 2>&1
tiny_args=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 --height 128
  --width 192 --steps 4 --dtype fp32 --device cuda --output-type latent --microbatch-size 1 --transport mpi)
"$bin" "${tiny_args[@]}" --out "$out/tiny-1.h5" > "$out/tiny-1.log" 2>&1 || { status=1; tail -5 "$out/tiny-1.log"; }
for n in 2 3; do
  mpirun --allow-run-as-root --bind-to none --oversubscribe -np $n "$bin" "${tiny_args[@]}" --out "$out/tiny-$n.h5" \
    > "$out/tiny-$n.log" 2>&1 || { status=1; tail -5 "$out/tiny-$n.log"; }
  if same_latents "$out/tiny-1.h5" "$out/tiny-$n.h5"; then
    echo "tiny, cuda fp32: $n ranks bit-identical to 1"
  else
    echo "tiny, cuda fp32: $n ranks DIFFER from 1"; status=1
  fi
done
elapsed "tiny runs"

# 2. Full size.
model="$out/flux-dev"
if [ ! -f "$model/model_index.json" ]; then
  "$bin" make-random --arch flux-dev --pipeline --out "$model" > "$out/make-random.log" 2>&1 || { tail -5 "$out/make-random.log"; exit 1; }
fi
elapsed "full-size folder"
full_args=(generate --model "$model" --prompt "a cat holding a sign that says hello world" --height "$height"
  --width "$width" --steps "$steps" --guidance 3.5 --dtype bf16 --device cuda --output-type latent --transport mpi)
"$bin" "${full_args[@]}" --out "$out/full-1.h5" --report "$out/report-1.json" > "$out/full-1.log" 2>&1 \
  || { status=1; tail -8 "$out/full-1.log"; }
grep -E "ms/step|stage (encode|denoise): [0-9]" "$out/full-1.log" | tail -3
elapsed "full size, 1 rank"
for map in auto pipeline; do
  mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${full_args[@]}" --device-map "$map" \
    --max-memory 0=16GB,1=16GB --out "$out/full-2-$map.h5" --report "$out/report-2-$map.json" \
    > "$out/full-2-$map.log" 2>&1 || { status=1; tail -12 "$out/full-2-$map.log"; }
  grep -E "runtime: ring|capped|loaded blocks|ms/step|microbatch steps|stage (encode|denoise): [0-9]" \
    "$out/full-2-$map.log" | cut -c1-220 | tail -9
  if same_latents "$out/full-1.h5" "$out/full-2-$map.h5"; then
    echo "full size, bf16 cuda: 2 ranks ($map) bit-identical to 1"
  else
    echo "full size, bf16 cuda: 2 ranks ($map) DIFFER from 1"; status=1
  fi
  elapsed "full size, 2 ranks, $map"
done
offload_section || status=1
exit $status
