#!/usr/bin/env bash
# Sets up, writes a tiny random FLUX pipeline (diffusers format, tokenizers included), plans it over two
# devices, generates images from two prompts in one process and then with `mpirun -np 2` (the transformer
# split over two ranks, rank 0 coordinating), and checks that both runs give the same latents. Every step
# prints what it did and how long it took.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${DIFFPIPE_BUILD:-$here/build}
bash "$here/launch/setup.sh"
bin="$build_dir/diffpipe"
demo=${DEMO_DIR:-$build_dir/demo}
model="$demo/tiny-flux"
rm -rf "$model"
mkdir -p "$demo"
echo "== make-tiny: a complete tiny FLUX pipeline folder"
"$bin" make-tiny --out "$model"
echo "== inspect: what the folder holds (headers only)"
"$bin" inspect --model "$model"
echo "== plan: the transformer over two devices, time-balanced ('pipeline') next to accelerate's 'balanced'"
# --device cpu: planned in the dtype the runs below use (fp32, generate's default on the CPU).
"$bin" plan --model "$model" --device cpu --device-map pipeline --world-size 2 --max-memory 0=1GB,1=1GB --height 256 --width 256
echo "== generate: two prompts, two images each, PNGs and packed latents"
"$bin" generate --model "$model" --prompt "a cat sipping a margarita in a pool" --prompt "a lighthouse at dusk" \
  --num-images-per-prompt 2 --height 128 --width 192 --steps 4 --seed 42 --device cpu --dtype fp32 --out "$demo/cat.png"
"$bin" generate --model "$model" --prompt "a cat sipping a margarita in a pool" --height 128 --width 192 \
  --steps 4 --seed 42 --device cpu --dtype fp32 --output-type latent --out "$demo/cat-latents.h5"
echo "== generate over two MPI ranks: the same request, the transformer split in two (rank 0 coordinates)"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" generate --model "$model" \
  --prompt "a cat sipping a margarita in a pool" --height 128 --width 192 --steps 4 --seed 42 --device cpu --dtype fp32 \
  --output-type latent --out "$demo/cat-latents-2ranks.h5"
OMP_NUM_THREADS=1 "$bin" generate --model "$model" --prompt "a cat sipping a margarita in a pool" --height 128 \
  --width 192 --steps 4 --seed 42 --device cpu --dtype fp32 --output-type latent --out "$demo/cat-latents-1rank.h5" 2>/dev/null
# h5diff -d 0 compares the values exactly (h5dump's text has 6 significant digits).
if h5diff -q -d 0 "$demo/cat-latents-2ranks.h5" "$demo/cat-latents-1rank.h5" /latents /latents; then
  echo "2 ranks and 1 process: identical latents"
else
  echo "2 ranks and 1 process: latents DIFFER" >&2
  exit 1
fi
echo "== forward: the transformer split into two stages, as two ranks would run it"
"$bin" forward --model "$model" --height 256 --width 384 --stages 0:2,2:6 --repeat 2
echo "demo outputs in $demo"
