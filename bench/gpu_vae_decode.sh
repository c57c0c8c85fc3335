#!/usr/bin/env bash
# FLUX's VAE decode on one GPU (about 3 minutes with the build): diffusers' AutoencoderKL (NCHW against
# channels_last, kernel time by family: bench/vae_decode.py) and diffpipe's decode with its group norm kernel against
# ATen's (bench/vae_decode_bench.cpp) on the same random weights, and the CUDA tests of the kernels it touches
# (GroupNormCuda, FusedCuda). Expects the wheels of bench/fetch_wheels.sh in .whl/ (carry .whl). Figures only; the
# tests pass or fail.   bash bench/gpu_vae_decode.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
mkdir -p "$out"
exec > >(tee "$out/summary-vae-decode.txt") 2>&1
cd "$here" || exit 1
TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" -DCMAKE_CUDA_ARCHITECTURES=90 \
  > /tmp/vae-configure.log 2>&1 || { tail -20 /tmp/vae-configure.log; exit 1; }
# The build runs while the wheels install and diffusers decodes.
( ninja -C build-gpu models_vae_test models_fused_test vae_decode_bench > /tmp/vae-build.log 2>&1 ) &
build_job=$!
# shellcheck source=bench/gpu_python_env.sh
source bench/gpu_python_env.sh
install_carried_wheels "$here"
python3 bench/vae_decode.py --repeat 10 --save /tmp/vae-flux-random --json "$out/vae-decode-diffusers.json" 2>&1 \
  | grep -v "Warning\|_warn_once\|should be kept in float32"
wait $build_job || { echo "build failed:"; tail -30 /tmp/vae-build.log; exit 1; }
status=0
export DIFFPIPE_REQUIRE_CUDA=1
build-gpu/tests/unit/models_vae_test --gtest_filter='*Cuda*' 2>&1 | grep -E "max difference|OK \]|FAILED|PASSED|Failure" \
  || status=1
build-gpu/tests/unit/models_fused_test --gtest_filter='*Cuda*' 2>&1 | tail -2
for size in "1024 1024" "1024 1024" "768 1360"; do
  read -r height width <<< "$size"
  build-gpu/bench/vae_decode_bench --vae /tmp/vae-flux-random --height "$height" --width "$width" --repeats 10
done
exit $status
