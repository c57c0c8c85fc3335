#!/usr/bin/env bash
# Two real GPUs (nvidia-h200-x2, one rank per GPU over NCCL): issue 24's measurements, in parts that each fit
# one device call (10 minutes). Figures only; nothing fails on a timing. The checks that are not timings (the
# PNG of 2 ranks against 1, a killed rank) print "CHECK FAILED" and make the exit status 1.
#   bash bench/gpu_two.sh PART...     PART: CALIBRATE SEED DIFFUSERS THROUGHPUT NCCL KILL, or ALL (in that order)
#   CALIBRATE   diffpipe calibrate on GPU 0 at 768x1360 and 1024x1024, microbatch 1, 2, 4 ($OUT/calibration.json;
#               THROUGHPUT plans and simulates from it)
#   SEED        the seed workflow (configs/flux-dev-2gpu.json: 768x1360, 50 steps, guidance 3.5, bf16, text
#               encoders "balanced", transformer "auto", PNG) on 2 ranks capped at 16 GB each and uncapped, and
#               1 rank: PNGs compared byte for byte with 1 rank, hf_device_map per phase, peak per GPU,
#               wall / encode / denoise / decode seconds
#   DIFFUSERS   diffusers running the seed's own five steps on the same 2 GPUs and folder
#               (bench/seed_diffusers_two_gpu.py), timed per phase, the interpreter's start-up apart
#   THROUGHPUT  COUNTS images (default 1 2 4 8 16; one prompt, 768x1360, 12 steps, latents) on 1 GPU (one batch
#               of min(N, 4)) against 2 ranks for each of STRATEGIES (default pipeline auto balanced; microbatch
#               1, and the size --microbatch-size 0 chooses for pipeline): images/s, efficiency against twice
#               one GPU, the simulator's prediction from the calibration and its error, stage times per rank
#   NCCL        bandwidth between the two GPUs (torch.distributed send/recv, 32 to 512 MB) and, from the 8-image
#               pipeline run's --report, the time per step each rank spent waiting on its neighbour
#   KILL        rank 1 SIGKILLed at step 1 of a full-size 2-rank run: the job must end non-zero within the
#               transport timeout and a line written after the kill must name rank 1
# Environment: DIFFPIPE_BIN (a diffpipe built with CUDA and NCCL; unset: built here, Release, sm_90, the image's
# NCCL, which serves one rank per GPU), MODEL (a full-size flux-dev pipeline folder; unset: make-random --pipeline
# writes /tmp/flux-dev-pipeline, kept while the machine stays warm), COUNTS, STRATEGIES, STEPS (default 12),
# WORK (default /tmp/gpu_two), OUT (default build-gpu/out), BUDGET_S (default 580). THROUGHPUT and NCCL's
# per-step waits smoke-run on the CPU with DEVICE=cpu DTYPE=fp32 TRANSPORT=mpi SIZE=64x96 TEXT_TOKENS=32
# MODEL=<make-tiny folder> DIFFPIPE_BIN=build/diffpipe (figures meaningless there).
# DIFFUSERS needs the wheels of bench/fetch_wheels.sh carried in .whl/. $OUT gets summary-two.txt (this output),
# calibration.json, and logs-two.tar.gz (every log, report and JSON).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=${WORK:-/tmp/gpu_two}
mkdir -p "$out" "$work"
exec > >(tee -a "$out/summary-two.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_DEBUG=WARN
budget=${BUDGET_S:-580}
# shellcheck disable=SC2317  # run by the EXIT trap
pack() { tar czf "$out/logs-two.tar.gz" -C "$work" --exclude='*.safetensors' --exclude='*.h5' . 2>/dev/null; }
trap pack EXIT
parts=("$@")
[ ${#parts[@]} -gt 0 ] || { echo "usage: $0 CALIBRATE|SEED|DIFFUSERS|THROUGHPUT|NCCL|KILL|ALL ..."; exit 2; }
[ "${parts[0]}" = ALL ] && parts=(CALIBRATE SEED DIFFUSERS THROUGHPUT NCCL KILL)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
nvidia-smi topo -m 2>/dev/null | head -4
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] || echo "NOTE: $gpus GPU(s): the 2-rank runs below share one GPU and are no measure of two"

build_diffpipe
model=${MODEL:-/tmp/flux-dev-pipeline}
if [ ! -f "$model/model_index.json" ]; then  # written last: its presence means complete
  bounded "$bin" make-random --pipeline --arch flux-dev --dtype bf16 --force --out "$model" > "$work/make-random.log" 2>&1 \
    || { tail -5 "$work/make-random.log"; echo "make-random --pipeline failed"; exit 1; }
  elapsed "wrote $model"
fi
# Kept in $WORK between calls to a warm machine ($OUT starts empty each call); copied to $OUT when written.
cal="$work/calibration.json"
# --bind-to none: Open MPI binds each of two ranks to one core, and a rank then loads its weights at 5 GB/s
# instead of 35 (bench/RESULTS.md, 2026-12-07); users are told to launch this way (README, launch/mpirun.sh).
mpi2=(mpirun --allow-run-as-root --bind-to none --oversubscribe -np 2 -x NCCL_NVLS_ENABLE -x NCCL_DEBUG)
steps=${STEPS:-12}
device=${DEVICE:-cuda}
dtype=${DTYPE:-bf16}
transport=${TRANSPORT:-nccl}
size=${SIZE:-768x1360}
height=${size%x*}
width=${size#*x}
tokens=${TEXT_TOKENS:-512}
prompt="a photo of a red fox in the snow, golden hour"

# JSON field of a file, or "-" ("a.b.0.c" paths).
field() { python3 -c "
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split('.'):
    v = v[int(k)] if k.isdigit() else v[k]
print(v)" "$1" "$2" 2>/dev/null || echo "-"; }

part_calibrate() {
  local threads=()
  [ "$device" = cpu ] && threads=(--threads "${OMP_NUM_THREADS:-1}")
  for shape in $size 1024x1024; do
    [ "$device" = cpu ] && [ "$shape" = 1024x1024 ] && continue
    bounded "$bin" calibrate --model "$model" --device "$device" --dtype "$dtype" --height "${shape%x*}" \
      --width "${shape#*x}" --text-tokens "$tokens" --microbatch-size 1,2,4 --warmup 3 --repeat 10 "${threads[@]}" \
      --calibration "$cal" 2>&1 | grep -v "\[info\]"
  done
  cp "$cal" "$out/calibration.json"
  elapsed "calibrated"
}

# Per phase from --report-json (coordinator) and peaks from --report (every rank).
summarise_run() {  # NAME RANKS
  local name=$1 ranks=$2
  python3 - "$work/$name" "$ranks" <<'EOF'
import json, sys, pathlib
base, ranks = sys.argv[1], int(sys.argv[2])
try:
    doc = json.load(open(base + ".report.json"))
except OSError:
    print(f"  {base}: no report"); sys.exit(0)
phases = {s["name"]: s for s in doc["stages"]}
row = ", ".join(f"{n} {s['seconds']:.2f} s (load {s['load_seconds']:.2f})" for n, s in phases.items())
print(f"  {pathlib.Path(base).name}: wall {doc['total_seconds']:.2f} s; {row}; loop {doc['denoise_loop_seconds']:.2f} s")
paths = [base + ".rank.json"] if ranks == 1 else [f"{base}.rank.rank{r}.json" for r in range(ranks)]
for r, p in enumerate(paths):
    try:
        rep = json.load(open(p))
    except OSError:
        continue
    print(f"    rank {r} ({rep['device']}): blocks {rep['blocks']}, peak {rep['peak_device_bytes'] / 1e9:.2f} GB allocated / "
          f"{rep['peak_device_reserved_bytes'] / 1e9:.2f} GB reserved, compute {rep['compute_seconds']:.2f} s, "
          f"receive {rep['receive_seconds']:.2f} s, send {rep['send_seconds']:.2f} s over {rep['microbatch_steps']} microbatch steps")
EOF
}

part_seed() {
  # The config's fields as flags (its "ranks" would refuse the 1-rank reference).
  local seed=(generate --model "$model" --device cuda --dtype bf16 --height 768 --width 1360 --steps 50 --guidance 3.5
    --max-sequence-length 512 --seed 0 --pipeline-device-map balanced --device-map auto --output-type png
    --prompt "$(field "$here/configs/flux-dev-2gpu.json" prompt.0)")
  bounded "$bin" "${seed[@]}" --out "$work/seed-1.png" --report-json "$work/seed-1.report.json" \
    --report "$work/seed-1.rank.json" > "$work/seed-1.log" 2>&1 || { failed "seed, 1 rank"; tail -5 "$work/seed-1.log"; }
  summarise_run seed-1 1
  for variant in capped uncapped; do
    local caps="0=16GB,1=16GB"
    [ "$variant" = uncapped ] && caps="0=141GB,1=141GB"
    local name="seed-2-$variant"
    local wall_started; wall_started=$(date +%s.%N)
    bounded "${mpi2[@]}" "$bin" "${seed[@]}" --max-memory "$caps" --transport nccl --out "$work/$name.png" \
      --report-json "$work/$name.report.json" --report "$work/$name.rank.json" > "$work/$name.log" 2>&1 \
      || { failed "seed, 2 ranks $variant"; grep -E "error|FAIL" "$work/$name.log" | head -5; }
    # Kept as a file too: bench/gpu_pipeline.sh reads the capped run's wall for issue 25's two-GPU row.
    python3 -c "import time; print(f'{time.time() - $wall_started:.2f}')" > "$work/$name.wall"
    echo "$name: process wall $(cat "$work/$name.wall") s (mpirun and start-up included)"
    grep -oE "phase (encode|denoise|decode): hf_device_map .*" "$work/$name.log" | sed 's/^/  /'
    summarise_run "$name" 2
    if cmp -s "$work/seed-1.png" "$work/$name.png"; then
      echo "  PNG byte-identical to 1 rank ($(stat -c %s "$work/$name.png") bytes)"
      touch "$work/$name.identical"
    else
      failed "seed, 2 ranks $variant: the PNG differs from 1 rank"
    fi
  done
  elapsed "seed workflow"
}

part_diffusers() {
  source "$here/bench/gpu_python_env.sh"
  install_carried_wheels "$here"
  local t0; t0=$(date +%s.%N)
  bounded python3 "$here/bench/seed_diffusers_two_gpu.py" --model "$model" --out "$work/seed-diffusers.png" \
    --json "$work/seed-diffusers.json" --started-at "$t0" 2>&1 | grep -vE "it/s\]|Loading" | tail -12
  echo "  (process wall $(python3 -c "import time; print(f'{time.time() - $t0:.2f}')") s, interpreter start-up included)"
  [ -f "$work/seed-2-capped.png" ] && python3 - "$work/seed-2-capped.png" "$work/seed-diffusers.png" <<'EOF'
import sys
import numpy as np
from PIL import Image
a = np.asarray(Image.open(sys.argv[1]).convert("RGB"), dtype=np.float64)
b = np.asarray(Image.open(sys.argv[2]).convert("RGB"), dtype=np.float64)
mse = ((a - b) ** 2).mean() if a.shape == b.shape else float("nan")
print(f"  diffpipe (2 ranks, 16 GB caps) against diffusers: PSNR {10 * np.log10(255 ** 2 / mse) if mse > 0 else float('inf'):.1f} dB")
EOF
  elapsed "diffusers seed workflow"
}

simulated() {  # STRATEGY MICROBATCH IMAGES: images/s the calibrated simulator predicts for 2 GPUs
  local json="$work/sim-$1-$2-$3.json"
  "$bin" plan --model "$model" --world-size 2 --device-map "$1" --dtype "$dtype" --height "$height" --width "$width" \
    --text-tokens "$tokens" \
    --microbatch-size "$2" --simulate --prompts "$3" --steps "$steps" --calibration "$cal" --json > "$json" 2>/dev/null \
    || { echo "-"; return; }
  field "$json" simulation.maps.0.runs.0.images_per_s
}

part_throughput() {
  local one=(generate --model "$model" --device "$device" --dtype "$dtype" --height "$height" --width "$width"
    --steps "$steps" --max-sequence-length "$tokens" --seed 0 --output-type latent --prompt "$prompt" --transport-timeout 120)
  echo "images  setup                        images/s  efficiency  simulated  error   per-rank ms/microbatch step"
  for n in ${COUNTS:-1 2 4 8 16}; do
    [ "$(left)" -gt 60 ] || { echo "NOTE: out of time before $n images"; break; }
    local mb1=$(( n < 4 ? n : 4 ))
    local name="tp-$n-1gpu"
    bounded "$bin" "${one[@]}" --num-images-per-prompt "$n" --microbatch-size "$mb1" --out "$work/$name.h5" \
      --report-json "$work/$name.report.json" > "$work/$name.log" 2>&1 || { echo "  $name failed"; tail -3 "$work/$name.log"; continue; }
    local loop1; loop1=$(field "$work/$name.report.json" denoise_loop_seconds)
    local ips1; ips1=$(python3 -c "print(f'{$n / $loop1:.3f}')")
    printf "%6s  %-28s %9s\n" "$n" "1 GPU, microbatch $mb1" "$ips1"
    local setups=()
    for s in ${STRATEGIES:-pipeline auto balanced}; do setups+=("$s:1"); done
    [[ " ${STRATEGIES:-pipeline auto balanced} " == *" pipeline "* ]] && setups+=("pipeline:0")
    for setup in "${setups[@]}"; do
      local s=${setup%:*} mb=${setup#*:}
      [ "$(left)" -gt 40 ] || break
      name="tp-$n-2-$s-mb$mb"
      local caps=()
      [ "$s" = pipeline ] || caps=(--max-memory "0=141GB,1=141GB")
      bounded "${mpi2[@]}" "$bin" "${one[@]}" --num-images-per-prompt "$n" --device-map "$s" "${caps[@]}" \
        --microbatch-size "$mb" --calibration "$cal" --transport "$transport" --out "$work/$name.h5" \
        --report-json "$work/$name.report.json" --report "$work/$name.rank.json" > "$work/$name.log" 2>&1 \
        || { echo "  $name failed"; grep -E "error" "$work/$name.log" | head -3; continue; }
      local chosen=$mb
      [ "$mb" = 0 ] && chosen=$(grep -oE "microbatch size [0-9]+ chosen" "$work/$name.log" | head -1 | grep -oE "[0-9]+")
      local loop; loop=$(field "$work/$name.report.json" denoise_loop_seconds)
      local sim; sim=$(simulated "$s" "${chosen:-1}" "$n")
      python3 - "$n" "$s" "$mb" "${chosen:-?}" "$loop" "$ips1" "$sim" "$work/$name.rank.rank0.json" "$work/$name.rank.rank1.json" <<'EOF'
import json, sys
n, s, mb, chosen, loop, ips1, sim = sys.argv[1:8]
ips = int(n) / float(loop)
eff = ips / (2 * float(ips1))
per = []
for p in sys.argv[8:]:
    try:
        r = json.load(open(p))
        per.append(f"{1000 * r['compute_seconds'] / max(r['microbatch_steps'], 1):.1f}")
    except (OSError, KeyError, ValueError):
        per.append("-")
err = f"{100 * (float(sim) - ips) / ips:+.1f}%" if sim not in ("-", "") else "-"
sims = f"{float(sim):.3f}" if sim not in ("-", "") else "-"
label = f"2 ranks {s}, microbatch {chosen}" + (" (chosen)" if mb == "0" else "")
print(f"{n:>6}  {label:<28} {ips:9.3f}  {100 * eff:9.1f}%  {sims:>9}  {err:>6}   {' / '.join(per)}")
EOF
      grep -h "split planned from\|split \(planned\|--device-map\)" "$work/$name.log" | head -1 | sed 's/^.*runtime: /    /'
    done
  done
  echo "(efficiency: 2-rank images/s over twice one GPU's; simulated: plan --simulate from $cal)"
  elapsed "throughput"
}

part_nccl() {
  # A file, not stdin: the spawned workers import it.
  cat > "$work/nccl_bandwidth.py" <<'EOF'
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    for mb in (32, 128, 512):
        x = torch.empty(mb * 2**20, dtype=torch.uint8, device="cuda")
        move = dist.send if rank == 0 else dist.recv
        for _ in range(3):
            move(x, 1 - rank)
        torch.cuda.synchronize()
        dist.barrier()
        started, reps = time.perf_counter(), 10
        for _ in range(reps):
            move(x, 1 - rank)
        torch.cuda.synchronize()
        if rank == 1:
            s = (time.perf_counter() - started) / reps
            print(f"  NCCL send/recv GPU 0 -> 1, {mb} MiB: {mb * 2**20 / s / 1e9:.1f} GB/s ({1000 * s:.2f} ms)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if torch.cuda.device_count() < 2:
        print("  one GPU: no GPU-to-GPU bandwidth to measure")
        sys.exit(0)
    mp.spawn(worker, nprocs=2, join=True)
EOF
  bounded python3 "$work/nccl_bandwidth.py" 2>&1 | grep -v "^\\[W" | tail -5
  local rep="$work/tp-8-2-pipeline-mb1.rank"
  for r in 0 1; do
    [ -f "$rep.rank$r.json" ] || { echo "  (run THROUGHPUT with 8 images first for the per-step waits)"; break; }
    python3 - "$rep.rank$r.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
steps = max(r["microbatch_steps"], 1)
print(f"  rank {r['rank']} (8 images, pipeline): per microbatch step compute {1000 * r['compute_seconds'] / steps:.1f} ms, "
      f"waiting to receive {1000 * r['receive_seconds'] / steps:.1f} ms, sending {1000 * r['send_seconds'] / steps:.1f} ms; "
      f"{r['bytes_sent'] / steps / 1e6:.1f} MB sent per step")
EOF
  done
  elapsed "nccl"
}

part_kill() {
  local log="$work/killed.log" timeout=30
  bounded "${mpi2[@]}" "$bin" generate --model "$model" --device cuda --dtype bf16 --height 768 --width 1360 --steps 200 \
    --prompt "$prompt" --num-images-per-prompt 4 --output-type latent --transport nccl --transport-timeout $timeout \
    --out "$work/killed.h5" > "$log" 2>&1 &
  kill_rank $! "$log" "(step|progress) 1/200" 1 $timeout 150 || return
  local code=$job_code
  local seconds; seconds=$(python3 -c "import time; print(f'{time.time() - $killed_at:.1f}')")
  echo "rank 1 SIGKILLed at step 1 (full size, 2 GPUs, nccl): job exit $code, ended $seconds s later (timeout $timeout s)"
  [ "$code" -ne 0 ] || failed "killed rank: the job exited 0"
  tail -n +"$((lines_before + 1))" "$log" | grep -E "rank 1|process rank 1" | head -3
  tail -n +"$((lines_before + 1))" "$log" | grep -qE "rank 1" || failed "killed rank: no line after the kill names rank 1"
  elapsed "killed rank"
}

for part in "${parts[@]}"; do
  case "$part" in
    CALIBRATE) part_calibrate ;;
    SEED) part_seed ;;
    DIFFUSERS) part_diffusers ;;
    THROUGHPUT) [ -f "$cal" ] || part_calibrate; part_throughput ;;
    NCCL) part_nccl ;;
    KILL) part_kill ;;
    *) echo "unknown part $part"; status=2 ;;
  esac
done
exit $status
