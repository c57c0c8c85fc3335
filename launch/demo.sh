#!/usr/bin/env bash
# Sets up, writes a tiny random FLUX model, inspects it, and runs the transformer split into two stages
# exactly as two pipeline ranks would split it, printing timings and the output summary.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${DIFFPIPE_BUILD:-$here/build}
bash "$here/launch/setup.sh"
bin="$build_dir/diffpipe"
model=${DEMO_MODEL_DIR:-$build_dir/demo/tiny-flux}
rm -rf "$model"
echo "== make-tiny"
"$bin" make-tiny --out "$model"
echo "== inspect"
"$bin" inspect --model "$model"
echo "== forward, whole model"
"$bin" forward --model "$model" --height 256 --width 256 --repeat 2
echo "== forward, two stages: double blocks on one, single blocks on the other"
"$bin" forward --model "$model" --height 256 --width 384 --stages 0:2,2:6 --repeat 2 --save "$build_dir/demo/forward.safetensors"
