#!/usr/bin/env bash
# One call on the GPU machine: Release build, CUDA oracle tests, step benchmark, JSON results in $OUT.
#   bash bench/gpu.sh [--skip-diffusers]
#   STEP_SIDE=diffpipe or diffusers runs one side of the step benchmark (one call is limited to 10 minutes).
# Expects the wheels of bench/fetch_wheels.sh in .whl/ (the GPU image has no diffusers or transformers).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source "$here/bench/gpu_python_env.sh"
install_carried_wheels "$here"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
started=$(date +%s)
cmake -S "$here" -B "$here/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
  -DDIFFPIPE_PYTHON="$(command -v python3)" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
ninja -C "$here/build-gpu" diffpipe_cli models_flux_test models_fused_test models_lora_test pipeline_flux_test > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - started )) s"
ref="$here/build-gpu/reference"
python3 "$here/tests/reference/generate_all.py" --out "$ref" --only flux --only pipeline > "$out/oracle.log" 2>&1 || tail -20 "$out/oracle.log"
DIFFPIPE_REQUIRE_CUDA=1 DIFFPIPE_REFERENCE_DIR="$ref" DIFFPIPE_SOURCE_DIR="$here" \
  "$here/build-gpu/tests/unit/models_flux_test" --gtest_filter='*Cuda*:*CUDA*' 2>&1 | tee "$out/cuda_tests.log" | grep -E "relative|OK|FAILED|PASSED" | head -40
DIFFPIPE_REQUIRE_CUDA=1 DIFFPIPE_REFERENCE_DIR="$ref" DIFFPIPE_SOURCE_DIR="$here" \
  "$here/build-gpu/tests/unit/pipeline_flux_test" --gtest_filter='*Cuda*' 2>&1 | tee "$out/cuda_pipeline_tests.log" | grep -E "relative|PSNR|OK|FAILED|PASSED" | head -20
DIFFPIPE_REQUIRE_CUDA=1 DIFFPIPE_REFERENCE_DIR="$ref" DIFFPIPE_SOURCE_DIR="$here" \
  "$here/build-gpu/tests/unit/models_lora_test" --gtest_filter='LoraCuda*' 2>&1 | tee "$out/cuda_lora_tests.log" | grep -E "relative|OK|FAILED|PASSED" | head -10
DIFFPIPE_REQUIRE_CUDA=1 "$here/build-gpu/tests/unit/models_fused_test" 2>&1 | tee "$out/fused_tests.log" | grep -E "differ|OK|FAILED|PASSED" | head -60
model=/tmp/flux-dev-random
if [ ! -f "$model/model_index.json" ]; then
  "$here/build-gpu/diffpipe" make-random --arch flux-dev --dtype bf16 --out "$model" 2>&1 | tail -2
fi
python3 "$here/bench/flux_gpu_step.py" --diffpipe "$here/build-gpu/diffpipe" --model "$model" --json "$out/step-${STEP_SIDE:-all}.json" ${STEP_SIDE:+--only $STEP_SIDE} "$@" 2>&1 | tee "$out/step-${STEP_SIDE:-all}.log" | grep -v "^{"
