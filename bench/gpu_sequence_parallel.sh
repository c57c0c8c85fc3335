#!/usr/bin/env bash
# Sequence-parallel stage groups (generate --sequence-parallel K) on the GPU, in one device call.
#
#   bash bench/gpu_sequence_parallel.sh CHECK   correctness, exits non-zero when a check fails:
#       K = 2 and 3 ranks sharing one H200 over NCCL (2.30.7, NCCL_MULTI_RANK_GPU_ENABLE=1) against 1 rank:
#       the tiny pipeline with 12 heads in fp32 (1e-5 of the latents' scale) and bf16, and the FLUX.1-dev
#       architecture at full size (random weights) in bf16, 1024x1024, 4 steps, both within 3.2e-2 of the scale
#       (the bf16 tolerance of the GPU tests: eight bf16 ulps); K = 2 over the MPI transport too; a rank of a
#       group killed with SIGKILL ends the job within the transport timeout, named.
#   bash bench/gpu_sequence_parallel.sh BENCH   figures, never fails on a timing: one image at 1024x1024 /
#       28 steps and 768x1360 / 50 steps, 1 GPU against K = 2 (one GPU per rank when the machine has two, else
#       both ranks on the one GPU, said so): ms/step, speed-up, all-to-all ms per step from --report, and the
#       simulator's prediction beside each when `plan` takes --sequence-parallel.
#   bash bench/gpu_sequence_parallel.sh ALL     both.
#
# Environment: DIFFPIPE_BIN, a diffpipe built with CUDA and NCCL 2.30.7 (bench/gpu_check.sh passes its own);
# unset, it is built here as bench/gpu_nccl.sh builds it (carry .deps/: mkdir -p .deps && cp -r
# ../shared/deps/nccl .deps/). MODEL: a full-size flux-dev pipeline folder; unset, make-random writes one
# (about 40 s, in the background). WORK (default /tmp/gpu_sp), OUT (default build-gpu/out), BUDGET_S (default
# 590). After the build CHECK takes about 3 minutes and BENCH about 2.5 on one H200.
# $OUT gets summary-sp.txt (this output) and logs-sp.tar.gz (every log and report).
set -uo pipefail
mode=${1:-ALL}
case "$mode" in CHECK|BENCH|ALL) ;; *) echo "usage: $0 CHECK|BENCH|ALL"; exit 2 ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=${WORK:-/tmp/gpu_sp}
mkdir -p "$out" "$work"
exec > >(tee "$out/summary-sp.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=WARN
budget=${BUDGET_S:-590}
pack() { tar czf "$out/logs-sp.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='tiny*' --exclude='flux-dev' . 2>/dev/null; }
trap pack EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)

# --- The binary: given, or built as bench/gpu_nccl.sh builds it (NCCL 2.30.7 for ranks that share a GPU).
bin=${DIFFPIPE_BIN:-}
[ -n "$bin" ] || build_diffpipe_nccl
model=${MODEL:-$work/flux-dev}
make_random_job=
if [ ! -f "$model/model_index.json" ]; then
  ( bounded "$bin" make-random --arch flux-dev --pipeline --out "$model" > "$work/make-random.log" 2>&1 ) &
  make_random_job=$!
fi
wait_model() {
  if [ -n "$make_random_job" ]; then
    wait $make_random_job || { failed "make-random"; tail -5 "$work/make-random.log"; return 1; }
    make_random_job=
    elapsed "full-size folder written"
  fi
}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$here"/.whl/h5py-*.whl 2>/dev/null \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# close FILE_A FILE_B TOLERANCE: exit 0 when the latents agree within TOLERANCE of A's scale; prints the figure.
close() {
  python3 - "$@" <<'PY'
import sys, h5py, numpy as np
try:
    a = np.asarray(h5py.File(sys.argv[1])["latents"], dtype=np.float64)
    b = np.asarray(h5py.File(sys.argv[2])["latents"], dtype=np.float64)
except OSError as e:
    print(f"  cannot read latents: {e}"); sys.exit(1)
if a.shape != b.shape:
    print(f"  shapes {a.shape} {b.shape}"); sys.exit(1)
error = np.abs(a - b).max() / np.abs(a).max()
print(f"  max difference {error:.3g} of the scale{' (bit-identical)' if error == 0 else ''} (tolerance {sys.argv[3]})")
sys.exit(0 if error <= float(sys.argv[3]) else 1)
PY
}
# a2a REPORT_BASE STEPS: each rank's all-to-all seconds per denoising step, from --report.
a2a() {
  python3 - "$1" "$2" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + ".rank*.json")):
    d = json.load(open(path)); a = d.get("all_to_all", {}); steps = int(sys.argv[2])
    print(f"  rank {d['rank']} (group {d['mesh']['stage_group']}, shard {d['mesh']['shard']}): {a.get('calls', 0)} "
          f"all-to-alls, {a.get('bytes_sent', 0) / 1e6:.0f} MB out, {a.get('seconds', 0) / steps * 1e3:.2f} ms per step "
          f"({a.get('clock')} clock) of {d['compute_seconds'] / steps * 1e3:.1f} ms compute per step; peak device "
          f"{d['peak_device_bytes'] / 1e9:.1f} GB")
PY
}
prompt="a cat holding a sign that says hello world"

check() {
  # 1. The tiny pipeline with 12 heads: K = 2 and 3 ranks on one GPU.
  local tiny="$work/tiny12"
  "$bin" make-tiny --out "$tiny" --attention-heads 12 > "$work/make-tiny.log" 2>&1 || failed "make-tiny"
  for dtype in fp32 bf16; do
    local tolerance=1e-5
    [ $dtype = bf16 ] && tolerance=3.2e-2
    local args=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 --height 128
      --width 192 --steps 4 --dtype "$dtype" --device cuda --output-type latent --transport-timeout 60)
    bounded "$bin" "${args[@]}" --out "$work/tiny-$dtype-1.h5" > "$work/tiny-$dtype-1.log" 2>&1 \
      || { failed "tiny $dtype, 1 rank"; tail -5 "$work/tiny-$dtype-1.log"; continue; }
    for spec in "2 nccl" "3 nccl" "2 mpi"; do
      local k transport
      read -r k transport <<< "$spec"
      [ "$dtype" = bf16 ] && [ "$transport" = mpi ] && continue
      local name="tiny-$dtype-k$k-$transport"
      bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np "$k" "$bin" "${args[@]}" --sequence-parallel "$k" --transport "$transport" \
        --out "$work/$name.h5" --report "$work/$name.json" > "$work/$name.log" 2>&1 \
        || { failed "$name exited non-zero"; grep -E "error|failed|NCCL WARN" "$work/$name.log" | head -6; continue; }
      grep -q "transport $transport" "$work/$name.log" || failed "$name did not log transport $transport"
      [ "$transport" = nccl ] && { grep -q "NCCL 2.30.7" "$work/$name.log" || failed "$name did not load NCCL 2.30.7"; }
      echo "tiny 12 heads, cuda $dtype, K = $k on one GPU over $transport:"
      close "$work/tiny-$dtype-1.h5" "$work/$name.h5" $tolerance || failed "$name differs from 1 rank"
    done
  done
  elapsed "tiny checks"
  pack

  # 2. A rank of a group killed with SIGKILL mid-run under NCCL: the job ends within the timeout, named.
  local log="$work/killed.log" victim=1 timeout=20
  bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" generate --model "$tiny" --prompt "a cat" --height 128 \
    --width 192 --steps 1000 --dtype fp32 --device cuda --output-type latent --sequence-parallel 2 --transport nccl \
    --transport-timeout $timeout --out "$work/killed.h5" > "$log" 2>&1 &
  # Only what is written after the kill can report it: every line of rank 1 says "[rank 1]" anyway.
  if kill_rank $! "$log" "progress 1/1000" $victim $timeout 120; then
    local code=$job_code
    local seconds=$(( $(date +%s) - ${killed_at%.*} ))
    echo "K = 2 over nccl, rank $victim killed at step 1: job exit $code about $seconds s later (timeout $timeout s)"
    [ "$code" -ne 0 ] || failed "killed rank: exit 0"
    [ $seconds -le $((timeout + 10)) ] || failed "killed rank: ended after $seconds s"
    tail -n +"$((lines_before + 1))" "$log" |
      grep -Eqm1 "process rank $victim with PID [0-9]+ on node [^ ]+ exited on signal 9|\[rank 0\] \[error\] .*\brank $victim\b" \
      || failed "killed rank: no failure line after the kill names rank $victim"
  fi
  pack

  # 3. Full size, bf16, 1024x1024, 4 steps: K = 2 and 3 ranks sharing the GPU, each holding every block.
  wait_model || return
  local full=(generate --model "$model" --prompt "$prompt" --height 1024 --width 1024 --steps 4 --guidance 3.5
    --dtype bf16 --device cuda --output-type latent)
  bounded "$bin" "${full[@]}" --out "$work/full-1.h5" > "$work/full-1.log" 2>&1 || { failed "full size, 1 rank"; tail -6 "$work/full-1.log"; return; }
  grep -E "ms/step" "$work/full-1.log" | tail -1 | cut -c1-160
  for k in 2 3; do
    [ "$(left)" -lt 60 ] && { echo "full size K = $k skipped: $(left) s left"; continue; }
    local name="full-k$k"
    bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np $k "$bin" "${full[@]}" --sequence-parallel $k --transport nccl \
      --out "$work/$name.h5" --report "$work/$name.json" > "$work/$name.log" 2>&1 \
      || { failed "$name exited non-zero"; grep -E "error|failed|memory" "$work/$name.log" | head -6; continue; }
    grep -E "ms/step" "$work/$name.log" | tail -1 | cut -c1-160
    a2a "$work/$name" 4
    echo "full size, bf16, K = $k on one GPU over nccl:"
    close "$work/full-1.h5" "$work/$name.h5" 3.2e-2 || failed "$name differs from 1 rank beyond the bf16 tolerance"
    elapsed "full size K = $k"
    pack
  done
}

# ms_per_step REPORT_JSON: the denoising loop's ms per step after the first (its first use of each kernel and
# cuBLAS handle is not the rate), from generate --report-json's step end times.
ms_per_step() {
  python3 -c "
import json; e = json.load(open('$1'))['step_end_seconds']
print(f'{(e[-1] - e[0]) / (len(e) - 1) * 1e3:.1f}')" 2>/dev/null || echo "?"
}
# simulated WORLD K HEIGHT WIDTH STEPS: the simulator's ms per step for the mesh, when plan takes --sequence-parallel
# (--tflops 586: one H200's measured 126.9 ms step at 1024x1024, bench/RESULTS.md).
simulated() {
  grep -q -- "--sequence-parallel" <<<"$("$bin" plan --help 2>/dev/null)" || { echo "n/a"; return; }
  local link=nvlink
  "$bin" plan --model "$model" --world-size "$1" --sequence-parallel "$2" --height "$3" --width "$4" --steps "$5" \
    --prompts 1 --tflops 586 --device-map pipeline --link $link --simulate --json 2> "$work/plan-$1-$2-$3.err" \
    | python3 -c '
import json, sys
doc = json.load(sys.stdin); steps = int(sys.argv[1])
run = doc["simulation"]["maps"][0]["runs"][0]
found = {}
def walk(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items(): walk(value, path + "." + key)
    elif isinstance(node, (int, float)) and "all_to_all" in path and ("ms" in path or "seconds" in path or "_s" in path):
        found[path] = node
walk(doc["simulation"])
extra = "; ".join(f"{k.split(\".\")[-1]} {v:.3g}" for k, v in list(found.items())[:2])
print(f"{run[\"total_s\"] * 1e3 / steps:.1f} ms/step" + (f" ({extra})" if extra else ""))' "$5" 2>/dev/null || echo "n/a"
}

bench() {
  wait_model || return
  local placement="one GPU per rank"
  [ "$gpus" -lt 2 ] && placement="both ranks on the one GPU (no speed-up to expect: they take turns on it)"
  echo "bench: 1 GPU against K = 2, $placement; $gpus GPU(s)"
  printf '%-12s %6s %12s %12s %9s %18s %20s %20s\n' size steps "1 GPU ms" "K=2 ms" speed-up "a2a ms/step/rank" "sim 1 GPU" "sim K=2"
  for spec in "1024 1024 28" "768 1360 50"; do
    local h w steps
    read -r h w steps <<< "$spec"
    local size="${w}x${h}"
    [ "$(left)" -lt 70 ] && { echo "$size skipped: $(left) s left"; continue; }
    local args=(generate --model "$model" --prompt "$prompt" --height "$h" --width "$w" --steps "$steps" --guidance 3.5
      --dtype bf16 --device cuda --output-type latent)
    bounded "$bin" "${args[@]}" --out "$work/bench-$size-1.h5" --report-json "$work/bench-$size-1.steps.json" \
      > "$work/bench-$size-1.log" 2>&1 \
      || { echo "$size, 1 GPU failed"; tail -4 "$work/bench-$size-1.log"; continue; }
    bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${args[@]}" --sequence-parallel 2 --transport nccl \
      --out "$work/bench-$size-2.h5" --report "$work/bench-$size-2.json" --report-json "$work/bench-$size-2.steps.json" \
      > "$work/bench-$size-2.log" 2>&1 \
      || { echo "$size, K = 2 failed"; grep -E "error|failed" "$work/bench-$size-2.log" | head -4; continue; }
    local one two
    one=$(ms_per_step "$work/bench-$size-1.steps.json"); two=$(ms_per_step "$work/bench-$size-2.steps.json")
    local speedup a2a_ms
    speedup=$(python3 -c "print(f'{$one / $two:.2f}x')" 2>/dev/null || echo "?")
    a2a_ms=$(python3 -c "
import glob, json
ds = [json.load(open(p)) for p in sorted(glob.glob('$work/bench-$size-2.rank*.json'))]
print('/'.join(f\"{d['all_to_all']['seconds'] / $steps * 1e3:.1f}\" for d in ds))" 2>/dev/null || echo "?")
    printf '%-12s %6s %12s %12s %9s %18s %20s %20s\n' "$size" "$steps" "$one" "$two" "$speedup" "$a2a_ms" \
      "$(simulated 1 1 "$h" "$w" "$steps")" "$(simulated 2 2 "$h" "$w" "$steps")"
    a2a "$work/bench-$size-2" "$steps"
    close "$work/bench-$size-1.h5" "$work/bench-$size-2.h5" 3.2e-2 > /dev/null || echo "  (note: K = 2 latents differ from 1 GPU beyond 3.2e-2 after $steps steps)"
    elapsed "bench $size"
    pack
  done
}

case "$mode" in
  CHECK) check ;;
  BENCH) bench ;;
  ALL) check; bench ;;
esac
[ -n "$make_random_job" ] && kill $make_random_job 2>/dev/null
elapsed "done ($mode), status $status"
exit $status
