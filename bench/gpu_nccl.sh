#!/usr/bin/env bash
# One call on the one-GPU machine (600 s in all): the NCCL transport with ranks sharing the H200.
#   0. builds NCCL 2.30.7 (.deps/nccl/build.sh, a copy of ../shared/deps/nccl) while the project's rooms below
#      the runtime compile, then the runtime and the CLI against that NCCL (Release, sm_90, no tests);
#   1. tiny pipeline, fp32 on cuda: 1 rank, then 2 and 3 ranks over nccl and over mpi; latents bit-identical;
#   2. a rank killed with SIGKILL mid-run under nccl: the job ends non-zero within the transport timeout and
#      the output names the rank;
#   3. FLUX.1-dev architecture at full size (random weights), bf16, 768x1360, 8 steps: 1 rank, then 2 ranks
#      (--device-map auto --max-memory 0=16GB,1=16GB) over nccl and over mpi: ms/step, transfer seconds per
#      step from --report, latents against 1 rank. Skipped when less than 150 s remain.
# Every run prints the NCCL version it logged. A failing part does not stop the others; the exit status is
# non-zero when any check failed. $OUT gets summary.txt (this output) and logs.tar.gz (every log and report).
#   mkdir -p .deps && cp -r ../shared/deps/nccl .deps/   (here, once; .deps/ is ignored: carry it)
#   bash bench/gpu_nccl.sh      (on the GPU machine; BUDGET_S, default 590: the seconds the call may take)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=/tmp/gpu_nccl
mkdir -p "$out" "$work"
exec > >(tee "$out/summary.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NCCL 2.30 lets several ranks of one communicator share a GPU only with this (experimental in NCCL).
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=WARN
budget=${BUDGET_S:-590}
pack() {  # the logs and reports come back as one archive (a device call returns at most 8 files)
  tar czf "$out/logs.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='tiny' --exclude='flux-dev' . 2>/dev/null
}
trap pack EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

# 0. Build, against NCCL 2.30.7. Another libnccl.so.2 resolved first is a failed check (ours is preloaded).
build_diffpipe_nccl
[ -z "$nccl_preloaded" ] ||
  failed "link order: diffpipe-torch does not resolve libnccl.so.2 to $nccl_prefix/lib; using LD_PRELOAD"
# The full-size folder (random weights, ~33 GB) is written in the background while the tiny runs use the GPU.
model="$work/flux-dev"
( bounded "$bin" make-random --arch flux-dev --pipeline --out "$model" > "$work/make-random.log" 2>&1 ) &
make_random_job=$!

python3 -m pip install -q --no-index --no-deps --target /tmp/site "$here"/.whl/h5py-*.whl 2>/dev/null \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
same_latents() {  # FILE_A FILE_B: exit 0 when bit-identical; prints the difference otherwise
  python3 - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
try:
    a = np.asarray(h5py.File(sys.argv[1])["latents"]); b = np.asarray(h5py.File(sys.argv[2])["latents"])
except OSError as e:
    print(f"  cannot read latents: {e}"); sys.exit(1)
if a.shape == b.shape and np.array_equal(a, b):
    sys.exit(0)
print(f"  shapes {a.shape} {b.shape}, max difference {np.abs(a - b).max() / np.abs(a).max():.3g} of the scale"
      if a.shape == b.shape else f"  shapes {a.shape} {b.shape}")
sys.exit(1)
PY
}
nccl_logged() {  # LOG: the NCCL version line the coordinator logged, and the transport
  grep -oE "NCCL [0-9]+\.[0-9]+\.[0-9]+[^;]*|transport (nccl|mpi)" "$1" | sort -u | paste -sd';' -
}

# 1. Tiny pipeline on CUDA, fp32: neither the ranks nor the transport may change the result.
tiny="$work/tiny"
"$bin" make-tiny --out "$tiny" > "$work/make-tiny.log" 2>&1 || failed "make-tiny"
tiny_args=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 --height 128
  --width 192 --steps 4 --dtype fp32 --device cuda --output-type latent --microbatch-size 1 --transport-timeout 60)
bounded "$bin" "${tiny_args[@]}" --out "$work/tiny-1.h5" > "$work/tiny-1.log" 2>&1 || { failed "tiny, 1 rank"; tail -5 "$work/tiny-1.log"; }
for transport in nccl mpi; do
  for n in 2 3; do
    name="tiny-$n-$transport"
    bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np $n "$bin" "${tiny_args[@]}" --transport $transport --out "$work/$name.h5" --report "$work/$name.json" \
      > "$work/$name.log" 2>&1 || { failed "$name exited non-zero"; grep -E "error|failed|NCCL WARN" "$work/$name.log" | head -8; }
    echo "$name logged: $(nccl_logged "$work/$name.log")"
    grep -q "transport $transport" "$work/$name.log" || failed "$name did not log transport $transport"
    grep -q "NCCL 2.30.7" "$work/$name.log" || failed "$name did not load NCCL 2.30.7"
    if same_latents "$work/tiny-1.h5" "$work/$name.h5"; then
      echo "tiny, cuda fp32: $n ranks over $transport bit-identical to 1 rank"
    else
      failed "tiny, cuda fp32: $n ranks over $transport differ from 1 rank"
    fi
  done
done
elapsed "tiny runs"
pack

# 2. A rank killed with SIGKILL mid-run under NCCL.
kill_check() {
  local log="$work/killed.log" victim=2 timeout=20
  bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 3 "$bin" generate --model "$tiny" --prompt "a cat" --prompt "a dog" --num-images-per-prompt 2 \
    --height 128 --width 192 --steps 1000 --dtype fp32 --device cuda --output-type latent --microbatch-size 1 \
    --transport nccl --transport-timeout $timeout --out "$work/killed.h5" > "$log" 2>&1 &
  # Only what is written after the kill can report it: every line of the victim says "[rank N]" anyway.
  kill_rank $! "$log" "progress 1/1000" $victim $timeout 120 || return
  local code=$job_code
  local seconds
  seconds=$(python3 -c "import time; print(f'{time.time() - $killed_at:.1f}')")
  echo "rank $victim killed with SIGKILL at step 1 under nccl: job exit $code, ended $seconds s later (timeout $timeout s)"
  grep -E "rank $victim|error" "$log" | grep -v "^\[.*\] \[rank [01]\] \[info\]" | head -4
  [ "$code" -ne 0 ] || failed "killed rank: the job exited 0"
  python3 -c "import sys; sys.exit(0 if $seconds <= $timeout else 1)" || failed "killed rank: ended after $seconds s > $timeout s"
  # mpirun's report of the death, or rank 0's error line naming the victim.
  tail -n +"$((lines_before + 1))" "$log" |
    grep -Eq "process rank $victim with PID [0-9]+ on node [^ ]+ exited on signal 9|\[rank 0\] \[error\] .*\brank $victim\b" ||
    failed "killed rank: no failure line after the kill names rank $victim"
  [ ! -e "$work/killed.h5" ] || failed "killed rank: the run left its output file"
}
kill_check
elapsed "killed rank"
pack

# 3. Full size, when the time allows.
if [ "$(left)" -lt 150 ]; then
  echo "full size skipped: $(left) s left of $budget (needs 150)"
  kill $make_random_job 2>/dev/null
  exit $status
fi
wait $make_random_job || { failed "make-random"; tail -5 "$work/make-random.log"; exit $status; }
elapsed "full-size folder"
full_args=(generate --model "$model" --prompt "a cat holding a sign that says hello world" --height 768 --width 1360
  --steps 8 --guidance 3.5 --dtype bf16 --device cuda --output-type latent)
per_step() {  # REPORT_BASE: mean device send/receive seconds per step on each rank, from --report
  python3 - "$1" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + ".rank*.json")):
    d = json.load(open(path)); steps = d["per_step"] or [{}]
    mean = lambda key: sum(s.get(key, 0) for s in steps) / len(steps)
    print(f"  rank {d['rank']} ({d['transport']}, compute {d['compute_clock']}, transfers {d['transfer_clock']} clock): "
          f"per step compute {mean('compute_seconds') * 1e3:.1f} ms, send {mean('send_seconds') * 1e3:.1f} ms, "
          f"receive {mean('receive_seconds') * 1e3:.1f} ms; {d['bytes_sent'] / 1e6:.0f} MB sent, "
          f"peak device {d['peak_device_bytes'] / 1e9:.1f} GB")
PY
}
if [ "${FULL:-1}" = 1 ]; then
  bounded "$bin" "${full_args[@]}" --out "$work/full-1.h5" --report "$work/full-1.json" > "$work/full-1.log" 2>&1 \
    || { failed "full size, 1 rank"; tail -8 "$work/full-1.log"; }
  grep -E "ms/step" "$work/full-1.log" | tail -1 | cut -c1-200
  elapsed "full size, 1 rank"
fi
[ "${FULL:-1}" = 1 ] || FULL_TRANSPORTS=" "
for transport in ${FULL_TRANSPORTS:-nccl mpi}; do
  if [ "$(left)" -lt 60 ]; then echo "full size over $transport skipped: $(left) s left"; continue; fi
  name="full-2-$transport"
  bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${full_args[@]}" --device-map auto --max-memory 0=16GB,1=16GB --transport "$transport" \
    --out "$work/$name.h5" --report "$work/$name.json" > "$work/$name.log" 2>&1 \
    || { failed "$name exited non-zero"; grep -E "error|failed" "$work/$name.log" | head -6; }
  echo "$name logged: $(nccl_logged "$work/$name.log")"
  grep -E "ms/step" "$work/$name.log" | tail -1 | cut -c1-200
  per_step "$work/$name"
  if same_latents "$work/full-1.h5" "$work/$name.h5"; then
    echo "full size, bf16 cuda: 2 ranks over $transport bit-identical to 1 rank"
  else
    failed "full size, bf16 cuda: 2 ranks over $transport differ from 1 rank"
  fi
  elapsed "full size, 2 ranks, $transport"
  pack
done
# 4. The seed's workflow (../shared/seeds): encoders "balanced" with max_memory 16GB x 2, transformer "auto", the
#    VAE where the balanced map puts it, 768x1360, 50 steps, guidance 3.5, PNG; 2 ranks each capped at 16 GB
#    against one uncapped rank.
peaks() {  # REPORT_BASE: each rank's peak device memory against its 16 GB cap
  python3 - "$1" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + ".rank*.json")):
    d = json.load(open(path))
    peak = d["peak_device_bytes"]; reserved = d.get("peak_device_reserved_bytes", 0)
    print(f"  rank {d['rank']}: peak allocated {peak / 1e9:.2f} GB, reserved {reserved / 1e9:.2f} GB of the 16 GB cap"
          f" ({'under' if max(peak, reserved) < 16e9 else 'OVER'})")
    if max(peak, reserved) >= 16e9: sys.exit(1)
PY
}
if [ "${SEED:-1}" = 1 ] && [ "$(left)" -gt 120 ]; then
  seed_args=(generate --model "$model" --prompt "cinematic film still of a cat sipping a margarita in a pool in Palm Springs, California" \
    --height 768 --width 1360 --steps 50 --guidance 3.5 --dtype bf16 --device cuda --max-sequence-length 512)
  bounded "$bin" "${seed_args[@]}" --out "$work/seed-1.png" > "$work/seed-1.log" 2>&1 || { failed "seed workflow, 1 rank"; tail -6 "$work/seed-1.log"; }
  grep -E "ms/step|^  (encode|denoise|decode) " "$work/seed-1.log" | tail -4 | cut -c1-160
  elapsed "seed workflow, 1 rank"
  bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${seed_args[@]}" --pipeline-device-map balanced \
    --max-memory 0=16GB,1=16GB --device-map auto --transport nccl --out "$work/seed-2.png" --report "$work/seed-2.json" \
    > "$work/seed-2.log" 2>&1 || { failed "seed workflow, 2 ranks"; grep -E "error|failed|memory" "$work/seed-2.log" | head -6; }
  grep -E "phase (encode|denoise|decode): hf_device_map" "$work/seed-2.log" | cut -c1-260
  grep -E "ms/step|^  (encode|denoise|decode) |wrote .*png" "$work/seed-2.log" | tail -5 | cut -c1-160
  peaks "$work/seed-2" || failed "seed workflow: a rank's peak is over its 16 GB cap"
  if cmp -s "$work/seed-1.png" "$work/seed-2.png"; then echo "seed workflow: 2 capped ranks give the same PNG as 1 rank"
  else failed "seed workflow: the PNGs of 1 and 2 ranks differ"; fi
  elapsed "seed workflow, 2 ranks"
  pack
fi

# 5. Offloaded blocks: auto under caps too small for the transformer streams the last blocks to rank 1's GPU.
if [ "${OFFLOAD:-1}" = 1 ] && [ "${FULL:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  off_args=(generate --model "$model" --prompt "a cat holding a sign that says hello world" --height 768 --width 1360
    --steps 4 --guidance 3.5 --dtype bf16 --device cuda --output-type latent)
  bounded "$bin" "${off_args[@]}" --out "$work/off-1.h5" > "$work/off-1.log" 2>&1 || failed "offload reference, 1 rank"
  bounded mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 "$bin" "${off_args[@]}" --device-map auto \
    --max-memory 0=12GB,1=8GB,cpu=64GB --transport nccl --out "$work/off-2.h5" --report "$work/off-2.json" \
    > "$work/off-2.log" 2>&1 || { failed "offload, 2 ranks"; grep -E "error|failed|memory" "$work/off-2.log" | head -6; }
  grep -E "runtime: ring|offloaded block|ms/step" "$work/off-2.log" | tail -4 | cut -c1-240
  per_step "$work/off-2"
  if same_latents "$work/off-1.h5" "$work/off-2.h5"; then echo "offload: 2 ranks with offloaded blocks bit-identical to 1 rank"
  else failed "offload: 2 ranks with offloaded blocks differ from 1 rank"; fi
  elapsed "offload"
  pack
fi
exit $status
