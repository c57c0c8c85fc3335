# shellcheck shell=bash
# Sourced by bench/gpu_{two,nccl,sequence_parallel,calibrate}.sh once they have set `here` (the checkout) and
# `work` (their scratch folder) and sent their output to their summary; `budget` (seconds) is theirs to set.
# What it gives them:
#   - the environment of every GPU run here: NVLink multicast off (KINDS.md says why), unbuffered Python;
#   - elapsed MESSAGE, left, bounded COMMAND...: the clock against the budget, and a command killed when the
#     budget runs out, so that one hung run cannot take the others' time or the logs;
#   - failed MESSAGE: a check that failed ("CHECK FAILED: ..."; the script exits with $status);
#   - build_diffpipe, build_diffpipe_nccl: the diffpipe to run ($bin);
#   - kill_rank: one rank of a running mpirun job SIGKILLed, and the job waited for (bounded).
# shellcheck disable=SC2034,SC2154  # the variables set here are the sourcing script's, and so are those it reads
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
started=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - started )) s] $*"; }
left() { echo $(( budget - ($(date +%s) - started) )); }
status=0
failed() { echo "CHECK FAILED: $*"; status=1; }
bounded() { timeout -k 5 "$(( $(left) > 20 ? $(left) - 10 : 10 ))" "$@"; }

# build_diffpipe: bin=DIFFPIPE_BIN when set; else diffpipe built here into build-gpu (Release, sm_90, no tests,
# the image's NCCL, which serves one rank per GPU). A failed build ends the script with the log's tail.
build_diffpipe() {
  bin=${DIFFPIPE_BIN:-}
  [ -z "$bin" ] || return 0
  TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  build="$here/build-gpu"
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP" \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDIFFPIPE_BUILD_TESTS=OFF > "$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; exit 1; }
  ninja -C "$build" diffpipe_cli >> "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  bin="$build/diffpipe"
  elapsed "built"
}

# build_diffpipe_nccl: diffpipe built here against NCCL 2.30.7, which lets ranks share a GPU (.deps/nccl/build.sh,
# a copy of ../shared/deps/nccl: carry .deps/). NCCL compiles in the background while the rooms that do not see
# it compile in the foreground. Sets bin and nccl_prefix; nccl_preloaded=1 when the executable resolved another
# libnccl.so.2 first (something on this machine, LD_LIBRARY_PATH), so that ours is preloaded and the runs still
# test NCCL 2.30.7. A failed build ends the script with the log's tail.
build_diffpipe_nccl() {
  nccl_prefix=/tmp/nccl-2.30.7
  ( bash "$here/.deps/nccl/build.sh" "$nccl_prefix" > "$work/nccl-build.log" 2>&1 ) &
  local nccl_job=$!
  TP=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  build="$here/build-gpu"
  local cmake_args=(-S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TP"
    -DCMAKE_CUDA_ARCHITECTURES=90 -DDIFFPIPE_BUILD_TESTS=OFF)
  cmake "${cmake_args[@]}" > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
  ninja -C "$build" diffpipe_pipeline diffpipe_fixtures >> "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  elapsed "rooms below the runtime built"
  wait $nccl_job || { echo "NCCL build failed:"; tail -30 "$work/nccl-build.log"; exit 1; }
  elapsed "NCCL built in $nccl_prefix"
  # -U: the first configure cached the system NCCL (2.28); this one must find only ours.
  cmake "${cmake_args[@]}" -UDIFFPIPE_NCCL_INCLUDE_DIR -UDIFFPIPE_NCCL_LIBRARY -DDIFFPIPE_NCCL_ROOT="$nccl_prefix" \
    >> "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
  grep "diffpipe: NCCL" "$work/build.log" | tail -1
  ninja -C "$build" diffpipe_cli >> "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
  bin="$build/diffpipe"
  ldd "$build/diffpipe-torch" | grep -E "libnccl|libtorch_cuda"
  # The executable links our libnccl ahead of LibTorch's copy (src/runtime/CMakeLists.txt says how).
  nccl_preloaded=
  if ! ldd "$build/diffpipe-torch" | grep -q "libnccl.so.2 => $nccl_prefix/lib/"; then
    export LD_PRELOAD=$nccl_prefix/lib/libnccl.so.2
    nccl_preloaded=1
  fi
  elapsed "built"
}

# rank_pids RANK (bench/rank_pids.sh), shared with gpu_check.sh.
# shellcheck source=bench/rank_pids.sh
source "$(dirname "${BASH_SOURCE[0]}")/rank_pids.sh"

# kill_rank JOB LOG STEP VICTIM TIMEOUT WAIT_S: once LOG, the output of the background mpirun job JOB, matches
# STEP (grep -E; waited for at most WAIT_S seconds), SIGKILLs rank VICTIM and waits for the job to end, at most
# TIMEOUT (its --transport-timeout) + 40 s, after which it is sent SIGTERM: a job that outlives the timeout by
# far is a hang. Sets lines_before (LOG's lines before the kill: only what is written after it can report it),
# killed_at (date +%s.%N of the kill) and job_code (the job's exit status). Returns 1, the check failed, when
# the run never reached STEP or the rank's process was not found.
kill_rank() {
  local job=$1 log=$2 step=$3 victim=$4 timeout=$5 wait_s=$6 polls=0
  until grep -Eq "$step" "$log" 2>/dev/null; do
    sleep 0.2; polls=$((polls + 1))
    if ! kill -0 "$job" 2>/dev/null || [ $polls -gt $((wait_s * 5)) ]; then
      failed "killed rank: the run never reached step 1"; tail -8 "$log"; kill "$job" 2>/dev/null; return 1
    fi
  done
  local pids
  mapfile -t pids < <(rank_pids "$victim")
  [ "${#pids[@]}" -gt 0 ] || { failed "killed rank: rank $victim's process not found"; kill "$job" 2>/dev/null; return 1; }
  lines_before=$(wc -l < "$log")
  killed_at=$(date +%s.%N)
  kill -9 "${pids[@]}"
  local deadline=$(( $(date +%s) + timeout + 40 ))
  while kill -0 "$job" 2>/dev/null && [ "$(date +%s)" -lt $deadline ]; do sleep 0.2; done
  if kill -0 "$job" 2>/dev/null; then
    failed "killed rank: the job still ran $((timeout + 40)) s after rank $victim was killed"; kill -TERM "$job"
  fi
  wait "$job"; job_code=$?
}
