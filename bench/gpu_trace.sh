#!/usr/bin/env bash
# One call on the two-GPU machine (nvidia-h200-x2): a 2-rank timeline of FLUX.1-dev's architecture at full size
# (random weights, bf16), one rank per H200, for docs/.
#   1. builds the CLI (Release, sm_90, no tests);
#   2. make-random --arch flux-dev --pipeline; generate on 2 ranks (transport auto: nccl when the build found
#      NCCL), 2 prompts x 2 images, microbatch 1, STEPS (default 8) steps at HEIGHTxWIDTH (768x1360), PNG output,
#      with --trace and --report;
#   3. `diffpipe report` over the reports, and bench/trace_picture.py draws the trace.
# $OUT gets trace-h200-2rank.json, trace-h200-2rank.svg (copy it to docs/), report.txt, report.json and run.log.
#   bash bench/gpu_trace.sh
# On the one-GPU machine both ranks share the H200: TRANSPORT=mpi (the image's NCCL refuses two ranks on one GPU),
# and the title says so.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=/tmp/gpu_trace
mkdir -p "$out" "$work"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=${STEPS:-8} height=${HEIGHT:-768} width=${WIDTH:-1360}
transport=${TRANSPORT:-auto}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
placement="2 H200"
[ "$gpus" -ge 2 ] || placement="one H200 shared by both"
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$here" -B "$here/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DDIFFPIPE_BUILD_TESTS=OFF > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
ninja -C "$here/build-gpu" diffpipe_cli >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
bin="$here/build-gpu/diffpipe"
model="$work/flux-dev"
[ -f "$model/model_index.json" ] || "$bin" make-random --arch flux-dev --pipeline --out "$model" > "$out/make-random.log" 2>&1 \
  || { tail -5 "$out/make-random.log"; exit 1; }
timeout -k 5 420 mpirun --allow-run-as-root --bind-to none -np 2 "$bin" generate --model "$model" \
  --prompt "a cat holding a sign that says hello world" --prompt "a lighthouse at dusk" --num-images-per-prompt 2 \
  --microbatch-size 1 --height "$height" --width "$width" --steps "$steps" --guidance 3.5 --dtype bf16 --device cuda \
  --transport "$transport" --out "$work/img.png" --report "$work/report.json" --trace "$out/trace-h200-2rank.json" > "$out/run.log" 2>&1 \
  || { echo "generate failed:"; tail -20 "$out/run.log"; exit 1; }
grep -E "transport|ms/step|wrote trace" "$out/run.log" | tail -5 | cut -c1-200
"$bin" --version | tee "$out/version.txt"
"$bin" report "$work" | tee "$out/report.txt"
"$bin" report --json "$work" > "$out/report.json"
python3 "$here/bench/trace_picture.py" "$out/trace-h200-2rank.json" "$out/trace-h200-2rank.svg" \
  --title "diffpipe generate --trace: 2 ranks on $placement, transport $transport (FLUX.1-dev architecture, random weights, bf16, ${width}x${height}, 4 images, microbatch 1, ${steps} steps)"
