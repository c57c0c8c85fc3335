# shellcheck shell=bash
# Sourced by the GPU scripts: installs the carried wheels (.whl/, see bench/fetch_wheels.sh) into
# /tmp/site and puts it on PYTHONPATH. A wheel built for another Python than the image's is skipped with a
# note (the image then has to provide that package itself).
install_carried_wheels() {
  local here=$1 wheels=("$1"/.whl/*.whl)
  [ -e "${wheels[0]}" ] || { echo "no wheels in $here/.whl (run bench/fetch_wheels.sh on the dev machine)"; return 0; }
  local pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site)
  if ! "${pip[@]}" "${wheels[@]}" 2>/dev/null; then
    for w in "${wheels[@]}"; do "${pip[@]}" "$w" 2>/dev/null || echo "skipped $(basename "$w") (not for this Python)"; done
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -c 'import sys, diffusers, transformers; print("python", sys.version.split()[0], "diffusers", diffusers.__version__, "transformers", transformers.__version__)'
}
