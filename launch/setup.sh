#!/usr/bin/env bash
# Installs everything diffpipe needs on a fresh Debian 12 machine, then configures and builds.
#   bash launch/setup.sh            apt packages + oracle venv + RelWithDebInfo build in ./build
#   SKIP_APT=1 / SKIP_BUILD=1       skip a phase (the GPU image already has its packages)
# The venv lives outside the checkout (DIFFPIPE_VENV) so that fresh clones reuse the multi-GB torch wheel.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${DIFFPIPE_VENV:-$HOME/.cache/diffpipe/venv}
build_dir=${DIFFPIPE_BUILD:-$here/build}
build_type=${DIFFPIPE_BUILD_TYPE:-RelWithDebInfo}

say() { printf '[setup] %s\n' "$*"; }

if [ "${SKIP_APT:-0}" != 1 ]; then
  apt_packages=(build-essential cmake ninja-build pkg-config git clang libclang-rt-14-dev
    openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools libspdlog-dev libfmt-dev libgtest-dev
    nlohmann-json3-dev libcli11-dev libpng-dev libsentencepiece-dev zlib1g-dev python3-venv
    # cluster/: a real SLURM (cluster/slurm/test.sh) and namespace hosts (cluster/local/test.sh)
    slurmctld slurmd slurm-client munge iproute2 util-linux procps
    # tests/cluster/shellcheck.sh: the launch and cluster scripts are linted in ctest
    shellcheck)
  missing=()
  for p in "${apt_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    say "apt install: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    say "apt packages present"
  fi
fi

stamp="$venv/.diffpipe-requirements"
if [ ! -f "$stamp" ] || ! cmp -s "$stamp" "$here/tests/reference/requirements.txt"; then
  say "creating oracle venv at $venv (torch is a large download the first time)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$here/tests/reference/requirements.txt"
  cp "$here/tests/reference/requirements.txt" "$stamp"
else
  say "oracle venv up to date at $venv"
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  torch_prefix=$("$venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # A compiler cache, where the machine has one, lets several checkouts share object files (2-core machines).
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  say "configure ($build_type) in $build_dir"
  cmake -S "$here" -B "$build_dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE="$build_type" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DDIFFPIPE_PYTHON="$venv/bin/python"
  say "build"
  cmake --build "$build_dir" -j "$(nproc)"
fi
say "done"
