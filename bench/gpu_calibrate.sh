#!/usr/bin/env bash
# Measured block times on one H200, in one device call (about 5-6 minutes with the build): `diffpipe calibrate`
# on the FLUX.1-dev architecture (random weights, bf16) at 1024x1024 and 768x1360, microbatch 1, 2 and 4, then for
# each shape and microbatch size the "pipeline" split for 2 GPUs planned from the calibration against the
# FLOP-scaled one (both simulated: 8 images, 12 steps, as the 2026-12-04 measurement on nvidia-h200-x2), and the
# microbatch efficiency curve with the size plan would choose. Figures only; nothing passes or fails on a time.
#   bash bench/gpu_calibrate.sh
# Environment: DIFFPIPE_BIN (a built diffpipe; unset: built here, Release, sm_90, no tests), MODEL (a folder with
# a full-size flux-dev transformer; unset: make-random writes one, 23.8 GB, in the background during nothing
# else), WORK (default /tmp/gpu_calibrate), OUT (default build-gpu/out), BUDGET_S (default 560). For a smoke run
# on the CPU: DEVICE=cpu DTYPE=fp32 SHAPES="64x96" TEXT_TOKENS=32 MODEL=<make-tiny folder> DIFFPIPE_BIN=build/diffpipe.
# $OUT gets summary-calibrate.txt (this output), calibration.json (the file the lead can carry to the two-GPU
# machine: its key is the GPU's name) and the plans as JSON.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=${WORK:-/tmp/gpu_calibrate}
mkdir -p "$out" "$work"
exec > >(tee "$out/summary-calibrate.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
budget=${BUDGET_S:-560}
device=${DEVICE:-cuda}
dtype=${DTYPE:-bf16}
shapes=${SHAPES:-1024x1024 768x1360}
tokens=${TEXT_TOKENS:-512}
[ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader

build_diffpipe
model=${MODEL:-$work/flux-dev}
if [ ! -f "$model/transformer/config.json" ] && [ ! -f "$model/config.json" ]; then
  bounded "$bin" make-random --arch flux-dev --dtype bf16 --force --out "$model" > "$work/make-random.log" 2>&1 \
    || { tail -5 "$work/make-random.log"; echo "make-random failed"; exit 1; }
  elapsed "wrote the full-size transformer to $model"
fi

cal="$out/calibration.json"
rm -f "$cal"
for shape in $shapes; do
  h=${shape%x*}; w=${shape#*x}
  bounded "$bin" calibrate --model "$model" --device "$device" --dtype "$dtype" --height "$h" --width "$w" --text-tokens "$tokens" \
    --microbatch-size 1,2,4 --warmup 3 --repeat 10 --calibration "$cal" 2>&1 | grep -v "\[info\]"
  elapsed "calibrated $shape"
done
echo "--- $cal"
cat "$cal"

# The split for 2 GPUs from the calibration against the FLOP-scaled one, each simulated (8 images, 12 steps).
for shape in $shapes; do
  h=${shape%x*}; w=${shape#*x}
  for mb in 1 2 4; do
    for source in calibrated flops; do
      if [ "$source" = calibrated ]; then times=(--calibration "$cal"); else times=(--no-calibration); fi
      json="$out/plan-$shape-mb$mb-$source.json"
      bounded "$bin" plan --model "$model" --world-size 2 --device-map pipeline --dtype "$dtype" --height "$h" --width "$w" \
        --text-tokens "$tokens" --microbatch-size "$mb" --simulate --prompts 8 --steps 12 "${times[@]}" --json > "$json" 2> "$work/plan.err" \
        || { echo "plan $shape mb$mb $source failed:"; tail -3 "$work/plan.err"; continue; }
      python3 - "$json" "$shape" "$mb" "$source" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
stages = plan["stage_times"]
sim = plan.get("simulation", {})
runs = [r for m in sim.get("maps", []) if m.get("map") == "pipeline" for r in m.get("runs", [])] if isinstance(sim, dict) else []
ring = " -> ".join(f"[{s['first_unit']} .. {s['last_unit']}] {s['ms']:.1f} ms" for s in stages["stages"])
print(f"{sys.argv[2]} mb{sys.argv[3]} {sys.argv[4]:>10}: {plan['calibration']['message'][:90]}")
print(f"    split {ring}; efficiency {100 * stages['pipeline_efficiency']:.1f}%")
for r in runs:
    print(f"    simulated {r.get('images')} images: {r.get('images_per_s', 0):.3f} images/s, efficiency {100 * r.get('efficiency', 0):.1f}%")
EOF
    done
  done
done

# The efficiency curve and the microbatch size plan chooses from it, for 8 and 16 images on 2 GPUs.
for shape in $shapes; do
  h=${shape%x*}; w=${shape#*x}
  for prompts in 8 16; do
    bounded "$bin" plan --model "$model" --world-size 2 --device-map pipeline --dtype "$dtype" --height "$h" --width "$w" \
      --text-tokens "$tokens" --simulate --prompts "$prompts" --steps 12 --calibration "$cal" --json \
      > "$out/plan-$shape-choose-$prompts.json" 2> "$work/plan.err" || { tail -3 "$work/plan.err"; continue; }
    python3 - "$out/plan-$shape-choose-$prompts.json" "$shape" "$prompts" <<'EOF'
import json, sys
choice = json.load(open(sys.argv[1]))["microbatch_choice"]
print(f"{sys.argv[2]}, {sys.argv[3]} images on 2 GPUs: {choice['reason']}")
for c in choice["candidates"]:
    print(f"    microbatch {c['microbatch']}: {c['images_per_s']:.3f} images/s simulated, slowest stage "
          f"{c['max_stage_ms']:.1f} ms ({c['times']}){'' if c['fits'] else ' does not fit'}")
EOF
  done
done
python3 - "$cal" <<'EOF'
import json, sys
entries = json.load(open(sys.argv[1]))["entries"]
print("efficiency curve (per-image step time relative to the cheapest microbatch; a step of 19 double and 38 single blocks):")
shapes = {}
for e in entries:
    step = e["embedders_ms"] + 19 * e["double_block_ms"] + 38 * e["single_block_ms"] + e["output_ms"]
    shapes.setdefault(f"{e['height']}x{e['width']}", {})[e["microbatch"]] = step / e["microbatch"]
for shape, per_image in shapes.items():
    best = min(per_image.values())
    row = ", ".join(f"mb{m}: {ms:.1f} ms/image ({100 * best / ms:.1f}%)" for m, ms in sorted(per_image.items()))
    print(f"  {shape}: {row}")
EOF
elapsed "done"
