#!/usr/bin/env bash
# Sets up (apt packages, oracle venv, build) and runs the whole test suite through ctest.
# The oracle (tests/reference, pinned diffusers/transformers/accelerate) runs first as a ctest fixture.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${DIFFPIPE_BUILD:-$here/build}
bash "$here/launch/setup.sh"
cd "$build_dir"
jobs=${DIFFPIPE_TEST_JOBS:-$(nproc)}
ctest --output-on-failure --timeout 1800 -j "$jobs" "$@"
