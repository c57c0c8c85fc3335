#!/usr/bin/env bash
# Configures and builds the torch-free rooms with DIFFPIPE_WITH_TORCH=OFF and no LibTorch on any search
# path; exits non-zero if any of them needs LibTorch.
#   torch_free_build.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
mkdir -p "$build"
unset CMAKE_PREFIX_PATH Torch_DIR
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDIFFPIPE_WITH_TORCH=OFF \
  -DDIFFPIPE_BUILD_TESTS=ON >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -q "diffpipe: LibTorch OFF" "$build.configure.log" || { echo "configure did not leave LibTorch out"; exit 1; }
cmake --build "$build" -j "${DIFFPIPE_LAYOUT_JOBS:-2}"
# Belt and braces: nothing in the tree may have found Torch's package.
if grep -q "^Torch_DIR:PATH=/" "$build/CMakeCache.txt"; then echo "Torch_DIR is set in the torch-free build"; exit 1; fi
for room in core io model_configs placement tokenizers fixtures; do
  lib=$(find "$build/src" -name "libdiffpipe_$room.a" | head -1)
  [ -n "$lib" ] || { echo "libdiffpipe_$room.a was not built"; exit 1; }
  echo "torch-free: $room ($(stat -c %s "$lib") bytes)"
done
