#!/usr/bin/env bash
# Run on the development machine: fills .whl/ with the pure-Python (and abi3) wheels that the GPU-side
# benchmarks and oracle scripts need to import diffusers' FluxPipeline there (the GPU image has torch but no diffusers or
# transformers, and cannot download), and h5py, with which the GPU checks compare latents files. Versions follow tests/reference/requirements.txt. numpy and Pillow
# are left out: the image has them, and their wheels would take most of the 64 MiB a device call carries.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$HOME/.cache/diffpipe/venv/bin/python}
pin() { grep -E "^$1==" "$here/tests/reference/requirements.txt"; }
rm -rf "$here/.whl" && mkdir -p "$here/.whl"
"$python" -m pip download -q --python-version 3.12 --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$here/.whl" "$(pin diffusers)" "$(pin transformers)" "$(pin sentencepiece)" "$(pin protobuf)" "$(pin h5py)"
rm -f "$here"/.whl/numpy-*.whl "$here"/.whl/pillow-*.whl
echo "$(find "$here/.whl" -maxdepth 1 -name "*.whl" | wc -l) wheels, $(du -sh "$here/.whl" | cut -f1) in .whl/"
