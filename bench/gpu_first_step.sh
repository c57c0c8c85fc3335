#!/usr/bin/env bash
# Where the first denoising step's extra time goes (issue 25: step 1 at most 1.1x a later step): one call on one
# GPU (about 5 minutes with the build). Builds diffpipe (Release, sm_90, no tests), writes the full-size random
# FLUX.1-dev pipeline folder, then runs `diffpipe generate` at 1024x1024, 28 steps (discarding a small first run):
#   1. each VARIANTS entry (default: FP8 GEMMs, bf16, FP8 with every kernel module loaded at start), printing the
#      first steps' wall times against the median step;
#   2. each TRACE entry (default: the FP8 run) under `nsys profile` when Nsight Systems is on the machine, else
#      with `--torch-profile` (LibTorch's profiler), and bench/first_step_trace.py on what it recorded: kernels,
#      idle time and CUDA API calls of steps 1 to 4.
# Figures only; nothing passes or fails on them. $OUT gets summary-first-step.txt and the traces' JSON figures.
#   VARIANTS="name|ENV=1|--flag;..." TRACE="name|ENV|--flag;..." BUDGET_S=480 bash bench/gpu_first_step.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/build-gpu/out}
work=/tmp/gpu_first_step
budget=${BUDGET_S:-480}
rm -rf "$work"
mkdir -p "$out" "$work"
exec > >(tee "$out/summary-first-step.txt") 2>&1
# shellcheck source=bench/gpu_build.sh
source "$here/bench/gpu_build.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
build_diffpipe
model=${MODEL:-/tmp/flux-dev-pipeline}
if [ ! -f "$model/model_index.json" ]; then  # written last: its presence means the folder is complete
  bounded "$bin" make-random --pipeline --arch flux-dev --dtype bf16 --force --out "$model" > "$work/make.log" 2>&1
  [ -f "$model/model_index.json" ] || { tail -5 "$work/make.log"; exit 1; }
  elapsed "wrote $model"
fi
bounded "$bin" generate --model "$model" --prompt "warm-up" --height 256 --width 256 --steps 2 \
  --output-type latent --out "$work/warm-up.h5" > "$work/warm-up.log" 2>&1
elapsed "discarded warm-up run (exit $?)"

# run NAME ENV FLAGS [PREFIX...]: one generate; its report is $work/NAME.json, its log $work/NAME.log.
run() {
  local name=$1 env=$2 flags=$3
  shift 3
  local image="$work/$name.png"
  [[ "$flags" != *"--output-type latent"* ]] || image="$work/$name.h5"
  # shellcheck disable=SC2086  # ENV and FLAGS are word lists
  bounded env $env "$@" "$bin" generate --model "$model" --device cuda --dtype bf16 --steps 28 --height 1024 \
    --width 1024 --prompt "a red fox in the snow" --seed 0 --max-sequence-length 512 --out "$image" \
    --report-json "$work/$name.json" $flags > "$work/$name.log" 2>&1
}
steps_line() {
  python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
name, path = sys.argv[1], sys.argv[2]
report = json.load(open(path))
ends = report["step_end_seconds"]
steps = [(b - a) * 1000 for a, b in zip([0] + ends, ends)]
median = statistics.median(steps[1:])
peak = max(s["peak_device_bytes"] for s in report["stages"]) / 1e9
print(f"{name:12} steps 1-6 ms: {' '.join(f'{s:6.1f}' for s in steps[:6])}   median {median:6.1f}   "
      f"step 1 / median {steps[0] / median:.3f}   step 1 - step 2 {steps[0] - steps[1]:+6.1f} ms   "
      f"loop {report['denoise_loop_seconds']:.3f} s   "
      f"start to output {report['process_start_to_outputs_seconds']:.2f} s   "
      f"peak {peak:.2f} GB")
EOF
}

IFS=';' read -ra variants <<< "${VARIANTS:-fp8||--fp8-gemms;bf16||;fp8eager|CUDA_MODULE_LOADING=EAGER|--fp8-gemms}"
for entry in "${variants[@]}"; do
  IFS='|' read -r name env flags <<< "$entry"
  [ "$(left)" -ge 40 ] || { elapsed "skipped $name: $(left) s left"; continue; }
  if run "$name" "$env" "$flags"; then
    steps_line "$name" "$work/$name.json"
  else
    echo "$name failed:"
    tail -5 "$work/$name.log"
  fi
done
# The warm-ups' own lines (their level tag dropped, so that a filter on "[info]" keeps them).
for entry in "${variants[@]}"; do
  name=${entry%%|*}
  grep -h "warmed up\|VAE loaded" "$work/$name.log" 2>/dev/null | sed "s/^\[[^]]*\] \[[a-z]*\] /$name: /" | cut -c1-200
done

# Each TRACE entry under Nsight Systems where the machine has it, else with --torch-profile (LibTorch's profiler:
# the kernels, copies and CUDA calls of the first steps); bench/first_step_trace.py compares the steps either way.
nsys_bin=$(command -v nsys)
for candidate in /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys; do
  [ -n "$nsys_bin" ] || [ ! -x "$candidate" ] || nsys_bin=$candidate
done
if [ -n "$nsys_bin" ]; then
  "$nsys_bin" --version
else
  echo "no Nsight Systems (nsys) here: --torch-profile instead"
fi
IFS=';' read -ra traces <<< "${TRACE:-fp8||--fp8-gemms}"
for entry in "${traces[@]}"; do
  IFS='|' read -r name env flags <<< "$entry"
  [ "$(left)" -ge 60 ] || { elapsed "skipped the trace of $name: $(left) s left"; continue; }
  if [ -n "$nsys_bin" ]; then
    run "trace-$name" "$env" "$flags" "$nsys_bin" profile -t cuda,nvtx --sample=none --cpuctxsw=none \
      --cuda-memory-usage=false --force-overwrite=true -o "$work/trace-$name" --export=sqlite \
      || { echo "nsys run of $name failed:"; tail -8 "$work/trace-$name.log"; continue; }
    recorded="$work/trace-$name.sqlite"
  else
    run "trace-$name" "$env" "$flags --torch-profile $work/profile-$name.json --torch-profile-steps 5" \
      || { echo "--torch-profile run of $name failed:"; tail -8 "$work/trace-$name.log"; continue; }
    recorded="$work/profile-$name.json"
  fi
  steps_line "trace-$name" "$work/trace-$name.json"
  python3 "$here/bench/first_step_trace.py" "$recorded" --json "$out/first-step-$name.json"
  elapsed "traced $name"
done
