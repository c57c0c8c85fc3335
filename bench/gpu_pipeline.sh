#!/usr/bin/env bash
# One call on the GPU machine: the whole FLUX.1-dev pipeline at full size with random weights (T5-XXL + CLIP
# encode, 28 steps at 1024x1024, VAE decode, bf16), `diffpipe generate` against diffusers' FluxPipeline on
# the same folder, time and peak memory per phase. Results (JSON, logs, both images) go to $OUT.
#   bash bench/gpu_pipeline.sh [more bench/pipeline_gpu_generate.py arguments, e.g. --steps 4]
#   PIPE_SIDE=diffpipe or diffusers runs one side only; MODEL=DIR uses another folder.
#   PROFILE=1 then profiles one 1024x1024 transformer step with Nsight Compute (bench/ncu_summary.py).
# Expects the wheels of bench/fetch_wheels.sh in .whl/ (the GPU image has no diffusers or transformers).
# The folder (33.7 GB) is written once per machine with `make-random --pipeline`.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
started=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - started )) s] $*"; }
source "$here/bench/gpu_python_env.sh"
install_carried_wheels "$here"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv > "$out/build.log" 2>&1
cat "$out/build.log"
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$here" -B "$here/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DDIFFPIPE_PYTHON="$(command -v python3)" >> "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
ninja -C "$here/build-gpu" diffpipe_cli pipeline_flux_test >> "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
elapsed "built diffpipe_cli and pipeline_flux_test"
# The tiny pipeline on CUDA against the CPU oracle first. A failure is reported and makes the script fail
# at the end, but the benchmark still runs: device time is scarce.
ref="$here/build-gpu/reference"
tests_status=0
if python3 "$here/tests/reference/generate_all.py" --out "$ref" --only pipeline > "$out/oracle.log" 2>&1; then
  DIFFPIPE_REQUIRE_CUDA=1 DIFFPIPE_REFERENCE_DIR="$ref" DIFFPIPE_SOURCE_DIR="$here" \
    "$here/build-gpu/tests/unit/pipeline_flux_test" --gtest_filter='*Cuda*' > "$out/cuda_pipeline_tests.log" 2>&1
  tests_status=$?
  grep -E "relative|PSNR|OK \]|FAILED|PASSED" "$out/cuda_pipeline_tests.log" | head -20
  [ "$tests_status" = 0 ] || tail -30 "$out/cuda_pipeline_tests.log"
else
  tests_status=1
  echo "oracle generation failed:"; tail -20 "$out/oracle.log"
fi
elapsed "CUDA pipeline oracle tests (exit $tests_status)"

model=${MODEL:-/tmp/flux-dev-pipeline}
if [ ! -f "$model/model_index.json" ]; then  # model_index.json is written last: its presence means complete
  "$here/build-gpu/diffpipe" make-random --pipeline --arch flux-dev --dtype bf16 --force --out "$model" 2>&1 \
    | grep -v "\[info\]" | tee "$out/make.log"
  [ -f "$model/model_index.json" ] || { echo "make-random --pipeline failed"; exit 1; }
  elapsed "wrote $model"
fi

side=${PIPE_SIDE:-all}
python3 "$here/bench/pipeline_gpu_generate.py" --diffpipe "$here/build-gpu/diffpipe" --model "$model" \
  --json "$out/pipeline-$side.json" ${PIPE_SIDE:+--only $PIPE_SIDE} "$@" 2>&1 | tee "$out/pipeline-$side.log"
status=${PIPESTATUS[0]}
elapsed "benchmark finished (exit $status)"
if [ "${PROFILE:-0}" = 1 ]; then
  ncu --clock-control none --csv --metrics gpu__time_duration.sum "$here/build-gpu/diffpipe" forward --model "$model" \
    --device cuda --dtype bf16 --height 1024 --width 1024 --text-len 512 --repeat 1 --warmup 0 \
    > "$out/ncu-step.csv" 2> "$out/ncu-step.log" || tail -5 "$out/ncu-step.log"
  python3 "$here/bench/ncu_summary.py" "$out/ncu-step.csv" --top 25 --json "$out/ncu-step.json" | tee "$out/ncu-step.txt"
  elapsed "profile finished"
fi
[ "$status" = 0 ] && exit "$tests_status"
exit "$status"
