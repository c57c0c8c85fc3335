#!/usr/bin/env bash
# The checks are functions that run_check invokes by name, which shellcheck cannot follow:
# shellcheck disable=SC2317
# The GPU pass/fail check: one device call on nvidia-h200 (about 8 minutes, the build included). Run it in
# every GPU session; it decides nothing about speed (the benchmarks, bench/gpu*.sh, print figures and decide
# nothing). Checks, each a row of the summary:
#   build               Release, sm_90: the CLI and every unit test binary that holds a CUDA test (a test
#                       whose suite or name says Cuda or CUDA), first against the image's NCCL, then the CLI
#                       again against NCCL 2.30.7, built from .deps/nccl in the background meanwhile (ranks
#                       sharing one GPU need 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1)
#   oracle-data         tests/reference/generate_all.py --only flux --only pipeline --only encoders (from .whl)
#   cuda-<binary>       that binary's CUDA tests with DIFFPIPE_REQUIRE_CUDA=1 (a missing GPU fails, never skips)
#   cuda-count          at least MIN_CUDA_TESTS (25: the 24 GPU tests and plan's CUDA-caps test, which needs no
#                       GPU) passed in all, so a filter that matched nothing cannot pass
#   oracle-full-size    tests/reference/full_size_gpu_oracle.py: a FLUX.1-dev-size transformer forward (make-random
#                       weights, bf16), diffpipe against diffusers on the GPU
#   nccl-tiny           tiny pipeline, fp32 on CUDA: 2 and 3 ranks over nccl give latents bit-identical to 1 rank;
#                       every run logs transport nccl and NCCL 2.30.7
#   nccl-killed-rank    rank 2 of 3 SIGKILLed at step 1 under nccl: the job ends non-zero within the transport
#                       timeout, a failure line written after the kill names rank 2, no output file is left
#   cuda-refusal        tiny pipeline on CUDA refused after the device opened (a cap that holds nothing): exit 3,
#                       the reason said, no image (not a crash in LibTorch's and CUDA's teardown)
#   offload-np1, -np2   tiny pipeline on CUDA under a map that offloads blocks to cpu and disk
#                       (tests/mpi/mpi_generate_test.py's offload_map): every rank that holds offloaded blocks
#                       streams them (logs its copies) and the latents are bit-identical to every block resident
# Every check runs even when another failed, unless it needs what failed; a check that has not run, for want of
# time (BUDGET_S, default 560 s) or of what it needs, counts as failed. Prints the table; exits 1 unless every
# row passed. $OUT receives summary.txt (this output) and logs.tar.gz (every log, the gtest XML files).
# Carry into the call (both ignored by git; in the repository root on the development machine):
#   mkdir -p .deps && cp -r ../shared/deps/nccl .deps/      the NCCL 2.30.7 source and its build script
#   bash bench/fetch_wheels.sh                              diffusers, transformers, h5py ... as wheels in .whl/
# Then, on the GPU machine from the repository root: bash bench/gpu_check.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/check-out}
work=/tmp/gpu_check
build="$here/build-gpu"
budget=${BUDGET_S:-560}
min_cuda_tests=${MIN_CUDA_TESTS:-25}
nccl_prefix=/tmp/nccl-2.30.7
mkdir -p "$out" "$work"
exec > >(tee "$out/summary.txt") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=WARN
started=$(date +%s)
left() { echo $(( budget - ($(date +%s) - started) )); }
say() { echo "[$(( $(date +%s) - started )) s] $*"; }
# A command killed when the budget ends, so that one hang cannot take the other checks' time.
bounded() { timeout -k 5 "$(( $(left) > 20 ? $(left) - 10 : 10 ))" "$@"; }
pack() {  # the logs come back as one archive (a device call returns at most 8 files)
  tar czf "$out/logs.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='tiny' --exclude='flux-dev' \
    --exclude='*.h5' . 2>/dev/null || true
}
trap pack EXIT

rows=()  # "name|result|seconds|note"
record() { rows+=("$1|$2|$3|$4"); }
# run_check NAME SECONDS_NEEDED FUNCTION [ARGS...]: FUNCTION runs in a subshell under set -e (any failing command
# fails the check), its output in $work/NAME.log, shown after it; its last "FAIL: " or "NOTE: " line is the
# note. Sets check_rc. Call it as a plain statement: inside `if`, `&&` or `||` bash would switch set -e off.
check_rc=1
run_check() {
  local name=$1 need=$2 fn=$3 begun rc note
  shift 3
  check_rc=1
  if [ "$(left)" -lt "$need" ]; then
    record "$name" "NOT RUN" 0 "$(left) s left of the budget, needs about $need"
    say "$name: NOT RUN ($(left) s left, needs about $need)"
    return 0
  fi
  begun=$(date +%s)
  say "$name ..."
  ( set -euo pipefail; "$fn" "$@" ) > "$work/$name.log" 2>&1
  rc=$?
  note=$(grep -E '^(FAIL|NOTE): ' "$work/$name.log" | tail -1 | cut -c7-140)
  [ "$rc" = 0 ] || [ -n "$note" ] || note="exit $rc: $(tail -1 "$work/$name.log" | cut -c1-120)"
  record "$name" "$([ "$rc" = 0 ] && echo PASS || echo FAIL)" "$(( $(date +%s) - begun ))" "$note"
  tail -n 12 "$work/$name.log" | sed 's/^/    /'
  check_rc=$rc
}
not_run() { record "$1" "NOT RUN" 0 "$2"; say "$1: NOT RUN ($2)"; }
fail() { echo "FAIL: $*"; exit 1; }
# finish_job PID SECONDS: waits at most SECONDS for a background job of this shell (then kills it) and sets
# job_rc to its exit status (124 when it was killed). Only this shell can wait for its jobs, not a check's
# subshell, so the checks read job_rc.
job_rc=1
finish_job() {
  local pid=$1 limit=$2 polls=0
  while kill -0 "$pid" 2>/dev/null && [ "$polls" -lt $(( limit * 5 )) ]; do sleep 0.2; polls=$((polls + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; job_rc=124; return 0
  fi
  wait "$pid"; job_rc=$?
}

# The device's copy of the working tree may carry an older .git than its files, so HEAD alone can name code that
# did not run: the id says how many tracked files differ from it, and a caller may pass its own (SOURCE_ID).
source_id() {
  if [ -n "${SOURCE_ID:-}" ]; then echo "$SOURCE_ID"; return; fi
  local head changed
  head=$(git -C "$here" rev-parse --short HEAD 2>/dev/null) || { echo '?'; return; }
  changed=$(git -C "$here" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  if [ "$changed" -eq 0 ]; then echo "git $head"; else echo "git $head with $changed tracked files changed"; fi
}

summary() {
  local row name result seconds note failures=0
  echo
  echo "== bench/gpu_check.sh: $(( $(date +%s) - started )) s; source $(source_id)"
  printf '%-26s %-8s %6s  %s\n' CHECK RESULT SECONDS NOTE
  for row in "${rows[@]}"; do
    IFS='|' read -r name result seconds note <<< "$row"
    printf '%-26s %-8s %6s  %s\n' "$name" "$result" "$seconds" "$note"
    [ "$result" = PASS ] || failures=$((failures + 1))
  done
  if [ "$failures" -gt 0 ]; then echo "$failures of ${#rows[@]} checks did not pass"; return 1; fi
  echo "all ${#rows[@]} checks passed"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no GPU visible"; exit 1; }

# ---- background work: NCCL 2.30.7, the wheels, the oracle data ----
nccl_job=""
if [ -f "$here/.deps/nccl/build.sh" ]; then
  ( bash "$here/.deps/nccl/build.sh" "$nccl_prefix" > "$work/nccl-build.log" 2>&1 ) &
  nccl_job=$!
fi
# shellcheck source=bench/gpu_python_env.sh
source "$here/bench/gpu_python_env.sh"
# shellcheck source=bench/rank_pids.sh
source "$here/bench/rank_pids.sh"
install_carried_wheels "$here" > "$work/wheels.log" 2>&1
python3 -c 'import diffusers, transformers, h5py' 2>/dev/null && have_wheels=1 || have_wheels=0
oracle_data() {
  [ "$have_wheels" = 1 ] || fail "diffusers, transformers or h5py cannot be imported: carry .whl (bench/fetch_wheels.sh)"
  python3 "$here/tests/reference/generate_all.py" --out "$build/reference" --only flux --only pipeline --only encoders
}
( set -euo pipefail; oracle_data ) > "$work/oracle-data.log" 2>&1 &
oracle_job=$!
oracle_started=$(date +%s)

# ---- build ----
# Every unit test source with a CUDA test: TEST/TEST_P/TEST_F whose suite or name contains Cuda or CUDA.
cuda_targets=()
for src in "$here"/tests/unit/*_test.cpp; do
  if grep -qE 'TEST(_P|_F)?\(\s*\w*(Cuda|CUDA)\w*\s*,|TEST(_P|_F)?\(\s*\w+\s*,\s*\w*(Cuda|CUDA)' "$src"; then
    cuda_targets+=("$(basename "$src" .cpp)")
  fi
done
build_all() {
  [ "${#cuda_targets[@]}" -gt 0 ] || fail "no unit test source holds a CUDA test"
  echo "CUDA test binaries: ${cuda_targets[*]}"
  local tp
  tp=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tp" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDIFFPIPE_PYTHON="$(command -v python3)" > "$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log"; fail "cmake configure"; }
  grep -q "DIFFPIPE_HAVE_CUDA" "$build/build.ninja" || fail "the build found no CUDA"
  bounded ninja -C "$build" diffpipe_cli "${cuda_targets[@]}" > "$work/ninja.log" 2>&1 \
    || { grep -E "error|FAILED" "$work/ninja.log" | head -20; fail "ninja"; }
  echo "NOTE: ${#cuda_targets[@]} test binaries and the CLI built"
}
run_check build 240 build_all
build_ok=$([ "$check_rc" = 0 ] && echo 1 || echo 0)
bin="$build/diffpipe"
tiny="$work/tiny"
if [ "$build_ok" = 1 ]; then
  "$bin" make-tiny --out "$tiny" --force > "$work/make-tiny.log" 2>&1 || say "make-tiny failed: $(tail -2 "$work/make-tiny.log")"
  # The full-size transformer (23.8 GB) is written while the CUDA tests run.
  ( bounded "$bin" make-random --arch flux-dev --dtype bf16 --out "$work/flux-dev" > "$work/make-random.log" 2>&1 ) &
  make_random_job=$!
fi
kill -0 "$oracle_job" 2>/dev/null && say "waiting for the oracle data"
finish_job "$oracle_job" "$(( $(left) > 120 ? 120 : $(left) ))"
oracle_rc=$job_rc

# ---- oracle data and the CUDA unit tests ----
wait_oracle_data() {
  [ "$oracle_rc" = 0 ] || { tail -20 "$work/oracle-data.log"; fail "generate_all.py exited $oracle_rc (log above)"; }
  ls "$build/reference/flux" "$build/reference/pipeline" > /dev/null || fail "no oracle data in $build/reference"
  echo "NOTE: flux and pipeline cases written in $(( $(date +%s) - oracle_started )) s"
}
run_check oracle-data 1 wait_oracle_data
data_ok=$([ "$check_rc" = 0 ] && echo 1 || echo 0)

passed_cuda_tests=0
cuda_binary() {  # $1: binary name; its CUDA tests, counted from gtest's XML
  local exe="$build/tests/unit/$1" xml="$work/$1.xml"
  [ -x "$exe" ] || fail "$exe was not built"
  bounded env DIFFPIPE_REQUIRE_CUDA=1 DIFFPIPE_REFERENCE_DIR="$build/reference" DIFFPIPE_SOURCE_DIR="$here" \
    "$exe" --gtest_filter='*Cuda*:*CUDA*' --gtest_output="xml:$xml" > "$work/$1.out" 2>&1 || {
    grep -E "FAILED|Failure|error" "$work/$1.out" | head -12; fail "$1 exited non-zero"; }
  grep -E "relative error|max difference|PSNR" "$work/$1.out" | head -8 || true
  python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
run = passed = skipped = failed = 0
for c in cases:
    if c.get("status") != "run":
        continue
    run += 1
    if c.find("failure") is not None:
        failed += 1
    elif c.get("result") == "skipped" or c.find("skipped") is not None:
        skipped += 1
    else:
        passed += 1
print(f"NOTE: {passed} passed, {skipped} skipped, {failed} failed of {run} CUDA tests")
sys.exit(1 if failed or run == 0 else 0)
PY
}
for target in "${cuda_targets[@]}"; do
  name="cuda-${target%_test}"
  if [ "$build_ok" != 1 ] || [ "$data_ok" != 1 ]; then not_run "$name" "needs the build and the oracle data"; continue; fi
  run_check "$name" 30 cuda_binary "$target"
  [ -f "$work/$name.log" ] || continue
  n=$(grep -oE '^NOTE: [0-9]+ passed' "$work/$name.log" | grep -oE '[0-9]+' || echo 0)
  passed_cuda_tests=$((passed_cuda_tests + ${n:-0}))
done
count_cuda() {
  echo "NOTE: $passed_cuda_tests CUDA tests passed in all (at least $min_cuda_tests expected)"
  [ "$passed_cuda_tests" -ge "$min_cuda_tests" ] || fail "only $passed_cuda_tests CUDA tests passed, at least $min_cuda_tests expected"
}
run_check cuda-count 1 count_cuda

# An input error found after the device has opened (here the microbatch choice under a cap that holds nothing)
# ends with the status of an input error, 3, and says why; the process ends without LibTorch's and CUDA's
# teardown (cli/command.h, end_after_command_error), which once crashed it (exit 139) on an H100.
refused_on_cuda() {
  local code=0
  bounded "$bin" generate --model "$tiny" --prompt "a cat" --device cuda --steps 2 --microbatch-size 0 \
    --max-memory 0=100MB --out "$work/refused.png" > "$work/refused.log" 2>&1 || code=$?
  tail -3 "$work/refused.log" | cut -c1-300
  [ "$code" = 3 ] || fail "exit $code, expected 3 (an input error)"
  grep -q "error: no microbatch size fits" "$work/refused.log" || fail "not refused by the microbatch choice"
  [ ! -e "$work/refused.png" ] || fail "an image was written"
  echo "NOTE: refused after the device opened: exit 3, the reason said, no image"
}
if [ "$build_ok" = 1 ] && [ -f "$tiny/model_index.json" ]; then
  run_check cuda-refusal 20 refused_on_cuda
else
  not_run cuda-refusal "needs the build and make-tiny's folder"
fi

# ---- the oracle at full size ----
full_size_oracle() {
  [ "$make_random_rc" = 0 ] || { tail -5 "$work/make-random.log"; fail "make-random --arch flux-dev exited $make_random_rc"; }
  bounded python3 "$here/tests/reference/full_size_gpu_oracle.py" --diffpipe "$bin" --model "$work/flux-dev"
}
make_random_rc=1
if [ "$build_ok" = 1 ]; then
  finish_job "$make_random_job" "$(( $(left) > 120 ? 120 : $(left) ))"
  make_random_rc=$job_rc
fi
if [ "$build_ok" = 1 ] && [ "$have_wheels" = 1 ]; then
  run_check oracle-full-size 100 full_size_oracle
else
  not_run oracle-full-size "needs the build and diffusers (.whl)"
fi
rm -rf "$work/flux-dev"  # 23.8 GB: the NCCL runs below need the disk less than the page cache needs it gone
pack

# ---- NCCL 2.30.7 and the CLI against it ----
rebuild_with_nccl() {
  [ -n "$nccl_job" ] || fail "no .deps/nccl/build.sh: carry .deps (cp -r ../shared/deps/nccl .deps/)"
  [ "$nccl_rc" = 0 ] || { tail -20 "$work/nccl-build.log"; fail "NCCL 2.30.7 build exited $nccl_rc"; }
  # -U: the first configure cached the image's NCCL; this one must find only ours.
  cmake "$build" -UDIFFPIPE_NCCL_INCLUDE_DIR -UDIFFPIPE_NCCL_LIBRARY -DDIFFPIPE_NCCL_ROOT="$nccl_prefix" \
    >> "$work/configure.log" 2>&1 || fail "cmake reconfigure with NCCL 2.30.7"
  bounded ninja -C "$build" diffpipe_cli >> "$work/ninja.log" 2>&1 || fail "ninja diffpipe_cli against NCCL 2.30.7"
  ldd "$build/diffpipe-torch" | grep -q "libnccl.so.2 => $nccl_prefix/lib/" \
    || fail "diffpipe-torch does not resolve libnccl.so.2 to $nccl_prefix/lib"
  echo "NOTE: the CLI links $nccl_prefix/lib/libnccl.so.2"
}
nccl_ok=0 nccl_rc=1
if [ -n "$nccl_job" ]; then
  kill -0 "$nccl_job" 2>/dev/null && say "waiting for the NCCL 2.30.7 build"
  finish_job "$nccl_job" "$(( $(left) > 60 ? $(left) - 60 : 1 ))"
  nccl_rc=$job_rc
fi
if [ "$build_ok" = 1 ]; then
  run_check build-nccl 90 rebuild_with_nccl
  nccl_ok=$([ "$check_rc" = 0 ] && echo 1 || echo 0)
else
  not_run build-nccl "needs the build"
fi

same_latents() {  # A B: the same dtype, shape and bytes
  python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a = np.asarray(h5py.File(sys.argv[1], "r")["latents"]); b = np.asarray(h5py.File(sys.argv[2], "r")["latents"])
if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
    sys.exit(0)
print(f"  {sys.argv[1]} {a.dtype}{a.shape} vs {sys.argv[2]} {b.dtype}{b.shape}" +
      (f": max difference {np.abs(a - b).max() / np.abs(a).max():.3g} of the scale" if a.shape == b.shape else ""))
sys.exit(1)
PY
}
# generate refuses an option given twice: the killed-rank run adds its own --steps and --transport-timeout.
tiny_request=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 --height 128
  --width 192 --dtype fp32 --device cuda --output-type latent --microbatch-size 1)
tiny_args=("${tiny_request[@]}" --steps 4 --transport-timeout 60)
mpi() { bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np "$1" "${@:2}"; }

nccl_tiny() {
  bounded "$bin" "${tiny_args[@]}" --out "$work/tiny-1.h5" > "$work/tiny-1.log" 2>&1 \
    || { tail -5 "$work/tiny-1.log"; fail "tiny, 1 rank"; }
  local n
  for n in 2 3; do
    mpi "$n" "$bin" "${tiny_args[@]}" --transport nccl --out "$work/tiny-$n.h5" > "$work/tiny-$n.log" 2>&1 \
      || { grep -E "error|failed|NCCL WARN" "$work/tiny-$n.log" | head -8; fail "tiny, $n ranks over nccl exited non-zero"; }
    grep -q "transport nccl" "$work/tiny-$n.log" || fail "$n ranks: transport nccl not logged"
    grep -q "NCCL 2.30.7" "$work/tiny-$n.log" || fail "$n ranks: NCCL 2.30.7 not loaded"
    same_latents "$work/tiny-1.h5" "$work/tiny-$n.h5" || fail "tiny, cuda fp32: $n ranks over nccl differ from 1 rank"
    echo "tiny, cuda fp32: $n ranks over nccl bit-identical to 1 rank"
  done
  echo "NOTE: 2 and 3 ranks over nccl bit-identical to 1 rank (NCCL 2.30.7)"
}

killed_rank() {
  local log="$work/killed.log" victim=2 timeout=20 job waited=0 lines_before killed_at code=0 pids=()
  # timeout itself in the background (not a function): killing it passes the signal on to mpirun.
  timeout -k 5 "$(( $(left) > 20 ? $(left) - 10 : 10 ))" mpirun --allow-run-as-root --bind-to none --oversubscribe -np 3 "$bin" \
    "${tiny_request[@]}" --steps 1000 --transport nccl --transport-timeout "$timeout" --out "$work/killed.h5" > "$log" 2>&1 &
  job=$!
  until grep -q "progress 1/1000" "$log" 2>/dev/null; do
    sleep 0.2; waited=$((waited + 1))
    if ! kill -0 "$job" 2>/dev/null || [ "$waited" -gt 600 ]; then
      kill "$job" 2>/dev/null || true; tail -8 "$log"; fail "the run never reached step 1"
    fi
  done
  mapfile -t pids < <(rank_pids "$victim")
  [ "${#pids[@]}" -gt 0 ] || { kill "$job" 2>/dev/null || true; fail "rank $victim's process not found"; }
  # Only what is written after the kill can report it: every line of rank 2 says "[rank 2]" anyway.
  lines_before=$(wc -l < "$log")
  killed_at=$(date +%s)
  kill -9 "${pids[@]}"
  local deadline=$(( killed_at + timeout + 40 ))
  while kill -0 "$job" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$job" 2>/dev/null; then kill -TERM "$job" 2>/dev/null || true; fail "the job still ran $((timeout + 40)) s after the kill"; fi
  wait "$job" || code=$?
  local seconds=$(( $(date +%s) - killed_at ))
  echo "rank $victim SIGKILLed at step 1: job exit $code after ${seconds} s (transport timeout $timeout s)"
  [ "$code" -ne 0 ] || fail "the job exited 0"
  [ "$seconds" -le "$timeout" ] || fail "the job ended ${seconds} s after the kill (> $timeout s)"
  tail -n +"$((lines_before + 1))" "$log" |
    grep -Em1 "process rank $victim with PID [0-9]+ on node [^ ]+ exited on signal 9|\[rank 0\] \[error\] .*\brank $victim\b" \
    || fail "no failure line after the kill names rank $victim"
  [ ! -e "$work/killed.h5" ] || fail "the killed run left its output file"
  echo "NOTE: exit $code ${seconds} s after the kill, rank $victim named"
}

offload_ranks() {  # $1: ranks. The offload map of tests/mpi on the tiny model, streamed on CUDA.
  local ranks=$1 map="$work/offload-$1.json" log="$work/offload-$1.log"
  python3 - "$here/tests/mpi" "$tiny/transformer/config.json" "$ranks" "$map" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import mpi_generate_test as m
config = json.load(open(sys.argv[2]))
mapping, expected = m.offload_map(config["num_layers"], config["num_single_layers"], int(sys.argv[3]))
json.dump(mapping, open(sys.argv[4], "w"))
json.dump({str(k): v for k, v in expected.items()}, open(sys.argv[4] + ".expected", "w"))
print(f"offloaded blocks per rank: {expected}")
PY
  [ -f "$work/tiny-1.h5" ] || bounded "$bin" "${tiny_args[@]}" --out "$work/tiny-1.h5" > "$work/tiny-1.log" 2>&1
  mpi "$ranks" "$bin" "${tiny_args[@]}" --device-map "$map" --out "$work/offload-$ranks.h5" > "$log" 2>&1 \
    || { grep -E "error|failed" "$log" | head -8; fail "$ranks rank(s) with offloaded blocks exited non-zero"; }
  grep -E "runtime: ring" "$log" | sed -E 's/; hf_device_map .*//' | cut -c1-200
  python3 - "$log" "$map.expected" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
expected = json.load(open(sys.argv[2]))
streamed = {(m.group(1) or m.group(2)): int(m.group(3)) for m in re.finditer(
    r"(?:\[rank (\d+)\] \[\w+\] (?:rank \d+: )?|rank (\d+): )(\d+) offloaded block\(s\) streamed in \d+ copies", text)}
for rank, blocks in expected.items():
    if streamed.get(rank) != len(blocks):
        print(f"FAIL: rank {rank} should stream {len(blocks)} offloaded block(s), logged {streamed.get(rank)}")
        sys.exit(1)
print(f"streamed (rank: blocks): {streamed}")
PY
  same_latents "$work/tiny-1.h5" "$work/offload-$ranks.h5" || fail "$ranks rank(s): latents differ from every block resident"
  echo "NOTE: $ranks rank(s), blocks streamed to the GPU, bit-identical to every block resident"
}
offload_np1() { offload_ranks 1; }
offload_np2() { offload_ranks 2; }

if [ "$nccl_ok" = 1 ] && [ -f "$tiny/model_index.json" ] && python3 -c 'import h5py' 2>/dev/null; then
  run_check nccl-tiny 60 nccl_tiny
  run_check nccl-killed-rank 60 killed_rank
  run_check offload-np1 30 offload_np1
  run_check offload-np2 40 offload_np2
else
  for name in nccl-tiny nccl-killed-rank offload-np1 offload-np2; do
    not_run "$name" "needs NCCL 2.30.7 and the CLI against it, make-tiny's folder and h5py (.whl)"
  done
fi

pack
summary
exit $?
