#!/usr/bin/env bash
# Installs the build tree into a fresh prefix, then configures, builds and runs a separate project that
# uses find_package(diffpipe).
#   find_package_consumer.sh BUILD_DIR WORK_DIR CONSUMER_SOURCE TORCH_DIR
set -euo pipefail
build=$1 work=$2 consumer=$3 torch_dir=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$consumer" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir"
cmake --build "$work/build" -j 2
"$work/build/diffpipe_consumer" "$work/model"
