#!/usr/bin/env bash
# Whether the steady step's wall time (126 ms at 1024x1024) sits above its kernels' sum (110 ms under Nsight
# Compute, which replays each kernel alone) because the GPU runs the loop at lower clocks: one call on
# nvidia-h200 (about 4 minutes with the build). Builds diffpipe (Release, sm_90), writes a full-size random
# FLUX.1-dev transformer, then times 30 forwards at 1024x1024 (512 text tokens, bf16) while nvidia-smi samples
# the SM clock, power and temperature every 100 ms, and prints both: ms per step, and the clock's spread during
# the loop against its idle and maximum values. Figures only; nothing passes or fails on them.
#   BUDGET_S=300 bash bench/gpu_clocks.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=/tmp/gpu_clocks
budget=${BUDGET_S:-300}
rm -rf "$work"
mkdir -p "$out" "$work"
exec > >(tee "$out/summary-clocks.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
build_diffpipe
model=/tmp/flux-dev-transformer
[ -f "$model/transformer/config.json" ] || [ -f "$model/config.json" ] \
  || bounded "$bin" make-random --arch flux-dev --dtype bf16 --force --out "$model" > "$work/make-random.log" 2>&1 \
  || { tail -5 "$work/make-random.log"; exit 1; }
elapsed "transformer written"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader,nounits \
  > "$work/idle.csv"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 100 \
  > "$work/loop.csv" &
sampler=$!
bounded "$bin" forward --model "$model" --device cuda --dtype bf16 --height 1024 --width 1024 --text-len 512 \
  --repeat 30 --warmup 3 > "$work/forward.log" 2>&1
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
grep -iE "ms|step|forward" "$work/forward.log" | tail -6
python3 - "$work/idle.csv" "$work/loop.csv" <<'PY'
import statistics, sys
idle = [float(x) for x in open(sys.argv[1]).read().split(",")]
rows = [[float(v) for v in line.split(",")[1:]] for line in open(sys.argv[2]) if line.count(",") == 3]
busy = [r for r in rows if r[1] > idle[2] + 100]  # samples drawing well above idle power: the loop
print(f"idle: SM clock {idle[0]:.0f} MHz (max {idle[1]:.0f}), power {idle[2]:.0f} W of {idle[3]:.0f} W, {idle[4]:.0f} C")
if busy:
    clocks = [r[0] for r in busy]
    power = [r[1] for r in busy]
    print(f"loop ({len(busy)} samples of {len(rows)}): SM clock median {statistics.median(clocks):.0f} MHz "
          f"(min {min(clocks):.0f}, max {max(clocks):.0f}), power median {statistics.median(power):.0f} W "
          f"(max {max(power):.0f}), temperature max {max(r[2] for r in busy):.0f} C")
else:
    print(f"no sample above idle power among {len(rows)}")
PY
elapsed "done"
