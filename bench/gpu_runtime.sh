#!/usr/bin/env bash
# One call on the GPU machine: the multi-rank runtime on CUDA with ranks sharing the one H200 over the MPI
# transport (host-staged).
#   1. the tiny pipeline, fp32 on cuda: 1, 2 and 3 ranks must give bit-identical packed latents;
#   2. FLUX.1-dev architecture at full size (random weights, make-random --pipeline, bf16): one rank, then
#      two ranks each capped at 16 GB with the transformer split by "auto" and by "pipeline", --report per rank.
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

# 1. Tiny pipeline on CUDA, fp32: ranks must not change the result.
tiny="$out/tiny"; rm -rf "$tiny"; "$bin" make-tiny --out "$tiny" > /dev/null 2>&1
tiny_args=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 --height 128
  --width 192 --steps 4 --dtype fp32 --device cuda --output-type latent --microbatch-size 1 --transport mpi)
"$bin" "${tiny_args[@]}" --out "$out/tiny-1.h5" > "$out/tiny-1.log" 2>&1 || { status=1; tail -5 "$out/tiny-1.log"; }
for n in 2 3; do
  mpirun --allow-run-as-root --oversubscribe -np $n "$bin" "${tiny_args[@]}" --out "$out/tiny-$n.h5" \
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
  mpirun --allow-run-as-root --oversubscribe -np 2 "$bin" "${full_args[@]}" --device-map "$map" \
    --max-memory 0=16GB,1=16GB --out "$out/full-2-$map.h5" --report "$out/report-2-$map.json" \
    > "$out/full-2-$map.log" 2>&1 || { status=1; tail -12 "$out/full-2-$map.log"; }
  grep -E "runtime: ring|capped|loaded blocks|ms/step|microbatch steps|stage (encode|denoise): [0-9]" \
    "$out/full-2-$map.log" | cut -c1-220 | tail -9
  if same_latents "$out/full-1.h5" "$out/full-2-$map.h5"; then
    echo "full size, bf16 cuda: 2 ranks ($map) bit-identical to 1"
  else
    echo "full size, bf16 cuda: 2 ranks ($map) differ from 1"
  fi
  elapsed "full size, 2 ranks, $map"
done
exit $status
