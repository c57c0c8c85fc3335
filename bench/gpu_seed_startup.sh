#!/usr/bin/env bash
# The seed request's start-up on two ranks, phase by phase (issue 25's two-GPU row): what each rank does between
# the command and step 1, with the NCCL set-up split into its parts. On one GPU the two ranks share it over NCCL
# 2.30.7 (NCCL_MULTI_RANK_GPU_ENABLE=1), which says nothing of the loop's speed and all of the start-up.
#   bash bench/gpu_seed_startup.sh            carry .deps (NCCL 2.30.7's source, bench/gpu_build.sh builds it)
# Environment: STEPS (default 4), RUNS (default "capped capped uncapped default": the seed's 16 GB caps twice,
# 70 GB caps, and 16 GB caps without --pipeline-device-map, so that the encoders stay on rank 0), BASE_PATCH (a
# patch of src/: also build this tree with it reverted and run every RUNS entry on both, "base-" and "new-" naming
# them), TINY_LAYOUTS (default "2 default" "3 default" "2 balanced" "3 balanced"; empty: no tiny runs), BUDGET_S
# (default 560). Make BASE_PATCH here and carry it in .deps: the device's copy of the tree may hold stale git
# metadata, so a `git diff` run there can come out empty (bench/RESULTS.md, session 21). Each run: mpirun -np 2
# --bind-to none, --log-level debug, NCCL_DEBUG=INFO for INIT; the summary keeps the lines of loads, forwards,
# warm-ups, NCCL set-up, step 1 and the timing summary, and each rank's peak from --report; $OUT holds
# every log and PNG (whose digests end the summary: the same request must give the same bytes).
set -u
# shellcheck disable=SC2034  # here, work and budget are bench/gpu_build.sh's to read
top=$PWD here=$PWD work=/tmp/seed-startup budget=${BUDGET_S:-560}
export NCCL_MULTI_RANK_GPU_ENABLE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-$work/out}
mkdir -p "$work" "$OUT"
# shellcheck source=bench/gpu_build.sh
source "$top/bench/gpu_build.sh"
build_diffpipe_nccl
declare -A binaries=([new-]="$bin")
if [ -n "${BASE_PATCH:-}" ]; then
  [ -s "$top/$BASE_PATCH" ] \
    || { echo "BASE_PATCH $BASE_PATCH is empty or missing: both builds would be the same"; exit 2; }
  base=/tmp/seed-startup-base
  rm -rf "$base" && mkdir -p "$base"
  tar -C "$top" --exclude=./build-gpu --exclude=./.whl -cf - . | tar -C "$base" -xf -
  (cd "$base" && patch -s -R -p1 < "$top/$BASE_PATCH") || { echo "BASE_PATCH did not revert"; exit 1; }
  here=$base work=$work/base; mkdir -p "$work"; build_diffpipe_nccl; binaries[base-]=$bin
  # shellcheck disable=SC2034  # read by build_diffpipe_nccl
  here=$top work=/tmp/seed-startup
fi
# First the tiny pipeline in fp32 over NCCL, where the links connect at either point (encoders on rank 0: after
# the loads; placed "balanced" on ranks 1 and 2: in the encode phase): every PNG byte-identical to 1 rank's.
tiny=$work/tiny
bounded "$bin" make-tiny --out "$tiny" --force > "$work/make-tiny.log" 2>&1 || { tail -3 "$work/make-tiny.log"; exit 1; }
tiny_request=(generate --model "$tiny" --prompt "a cat" --prompt "a dog" --height 128 --width 192 --dtype fp32
  --device cuda --steps 4 --microbatch-size 1 --transport-timeout 60)
bounded "$bin" "${tiny_request[@]}" --out "$OUT/tiny-1.png" > "$OUT/tiny-1.log" 2>&1 || echo "CHECK FAILED: tiny, 1 rank"
for layout in ${TINY_LAYOUTS-"2 default" "3 default" "2 balanced" "3 balanced"}; do
  read -r ranks map <<< "$layout"
  extra=()
  [ "$map" = balanced ] && extra=(--pipeline-device-map balanced --max-memory "$(seq -s, -f '%g=1GB' 0 $((ranks - 1)))")
  name="tiny-$ranks-$map"
  bounded mpirun -np "$ranks" --bind-to none "$bin" --log-level debug \
    "${tiny_request[@]}" "${extra[@]}" --transport nccl --out "$OUT/$name.png" > "$OUT/$name.log" 2>&1 \
    || { grep -E "error|NCCL WARN" "$OUT/$name.log" | head -5; echo "CHECK FAILED: $name exited non-zero"; }
  grep -oE "phase encode: hf_device_map .*" "$OUT/$name.log" | head -1
  grep -E "NCCL transport ready" "$OUT/$name.log" | cut -c1-240
  for image in 0 1; do  # two prompts: out-0.png and out-1.png
    if cmp -s "$OUT/tiny-1-$image.png" "$OUT/$name-$image.png"; then
      echo "$name: image $image byte-identical to 1 rank"
    else
      echo "CHECK FAILED: $name: image $image differs from 1 rank's (or is missing)"
    fi
  done
done
model=${MODEL:-/tmp/flux-dev-pipeline}
if [ ! -f "$model/model_index.json" ]; then
  bounded "$bin" make-random --pipeline --arch flux-dev --dtype bf16 --force --out "$model" > "$work/make-random.log" 2>&1 \
    || { tail -5 "$work/make-random.log"; exit 1; }
  elapsed "wrote $model"
fi
prompt=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['prompt'][0])" "$top/configs/flux-dev-2gpu.json")
request=(generate --model "$model" --device cuda --dtype bf16 --height 768 --width 1360 --steps "${STEPS:-4}"
  --guidance 3.5 --max-sequence-length 512 --seed 0 --output-type png --prompt "$prompt" --transport nccl)
# From the first log line (the ranks' checks done, before anything loads) to the end of step 1, on rank 0's clock.
to_step_1() {
  python3 - "$1" <<'PY'
import re, sys
def seconds(line):
    m = re.match(r"\[(\d+):(\d+):([\d.]+)\]", line)
    return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None
stamped = [(seconds(line), line) for line in open(sys.argv[1], errors="replace")]
stamped = [(t, line) for t, line in stamped if t is not None]
step_1 = [t for t, line in stamped if "progress 1/" in line]
print(f"first log line to step 1: {step_1[0] - stamped[0][0]:.2f} s" if step_1 else "no step 1")
PY
}
index=0
for run in ${RUNS:-capped capped uncapped default}; do
  index=$((index + 1))
  case $run in
    capped) placement=(--pipeline-device-map balanced --device-map auto --max-memory "0=16GB,1=16GB") ;;
    uncapped) placement=(--pipeline-device-map balanced --device-map auto --max-memory "0=70GB,1=70GB") ;;
    default) placement=(--device-map auto --max-memory "0=16GB,1=16GB") ;;
    *) echo "unknown run $run"; exit 2 ;;
  esac
  for prefix in "${!binaries[@]}"; do
    name="$prefix$index-$run"
    started_at=$(date +%s.%N)
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT bounded mpirun -np 2 --bind-to none \
      "${binaries[$prefix]}" --log-level debug "${request[@]}" \
      "${placement[@]}" --out "$OUT/$name.png" --report "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
      || echo "$name FAILED"
    echo "== $name: process wall $(python3 -c "import time; print(f'{time.time() - $started_at:.2f}')") s; $(to_step_1 "$OUT/$name.log")"
    # Each rank's peak on its device, against its cap: what the caps must hold, the warm-ups included.
    python3 - "$OUT/$name" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + ".rank*.json")):
    r = json.load(open(path))
    print(f"  {path.rsplit('/', 1)[-1]}: peak allocated {r.get('peak_device_bytes', 0) / 1e9:.2f} GB, "
          f"reserved {r.get('peak_device_reserved_bytes', 0) / 1e9:.2f} GB")
PY
    grep -E "NCCL transport ready|NCCL communicators being|Init timings|load /.*GB/s|forward|warm|progress 1/|  startup|  encode|  denoise|  decode|error" \
      "$OUT/$name.log" | cut -c1-240
  done
done
for png in "$OUT"/*.png; do echo "$(md5sum < "$png" | cut -c1-12) $(basename "$png")"; done
elapsed "done"
