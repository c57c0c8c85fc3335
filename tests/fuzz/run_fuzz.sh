#!/usr/bin/env bash
# Builds a libFuzzer target with clang in a torch-free CMake build (DIFFPIPE_FUZZ=ON: the parsers' rooms are
# compiled with coverage and sanitizers, LibTorch is never configured) and runs it for a fixed time over a
# copy of the committed seed corpus.
#
#   tests/fuzz/run_fuzz.sh [SECONDS=60] [TARGET=safetensors|index|clip_tokenizer|t5_tokenizer|spiece|checkpoint|lora_file]
#
# Findings (crash, sanitizer report, leak, timeout, out-of-memory, uncaught non-dp::Error exception) land
# in build-fuzz/artifacts/TARGET/ and make the script exit 1. Inputs the fuzzer discovers accumulate in
# build-fuzz/corpus-TARGET/ (ignored by git); the committed seeds are never modified.
# Single process on purpose: the build machines are shared; wrap in `nice -n 10` when running long.
set -euo pipefail

seconds=${1:-60}
target=${2:-safetensors}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out="$root/build-fuzz"
cxx=${CXX_FUZZ:-clang++}

# Each target's dictionary: the JSON and framing tokens its parser looks for.
case "$target" in
  safetensors|index) dict=safetensors.dict ;;
  clip_tokenizer|t5_tokenizer|spiece|lora_file) dict=$target.dict ;;
  checkpoint) dict="" ;;  # binary HDF5: no useful tokens
  *) echo "run_fuzz.sh: unknown target '$target' (safetensors|index|clip_tokenizer|t5_tokenizer|spiece|checkpoint|lora_file)" >&2; exit 2 ;;
esac
binary="$out/tests/fuzz/${target}_fuzz"
seeds="$root/tests/fuzz/corpus/$target"
work="$out/corpus-$target"
artifacts="$out/artifacts/$target"
mkdir -p "$out" "$work" "$artifacts"

# CMake rebuilds only what changed; the nlohmann-heavy translation units take a while under ASan.
if [[ ! -f "$out/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" -DDIFFPIPE_WITH_TORCH=OFF -DDIFFPIPE_FUZZ=ON >/dev/null
fi
cmake --build "$out" --target "${target}_fuzz" -j "${FUZZ_BUILD_JOBS:-2}" >/dev/null

# The working corpus is a copy, so libFuzzer can add and reduce files without touching the committed seeds.
cp -n "$seeds"/* "$work"/ 2>/dev/null || true

log="$out/fuzz-$target.log"
rm -f "$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-* 2>/dev/null || true
echo "run_fuzz.sh: fuzzing $target for ${seconds}s (log: $log)" >&2
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
dict_option=()
[[ -n "$dict" ]] && dict_option=(-dict="$root/tests/fuzz/$dict")
"$binary" "$work" \
  -max_total_time="$seconds" -max_len=65536 "${dict_option[@]}" \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" >"$log" 2>&1
status=$?
set -e

execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
if [[ -z "$execs" ]]; then
  # No final stats means the run died early; the last status line still carries the count.
  execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
fi
echo "run_fuzz.sh: target=$target seconds=$seconds executions=${execs:-unknown} exit=$status" \
     "corpus=$(ls "$work" | wc -l) files"
grep -E '^#[0-9]+ +DONE|cov:' "$log" | tail -1 || true

shopt -s nullglob
findings=("$artifacts"/crash-* "$artifacts"/leak-* "$artifacts"/timeout-* "$artifacts"/oom-*)
if (( status != 0 || ${#findings[@]} > 0 )); then
  echo "run_fuzz.sh: FINDING (exit $status):" "${findings[@]}" >&2
  grep -E -A25 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|terminate called|invariant' "$log" \
    | head -80 >&2 || true
  exit 1
fi
echo "run_fuzz.sh: no findings"
