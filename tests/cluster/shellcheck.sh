#!/usr/bin/env bash
# Every shell script of launch/, cluster/ and bench/ (the *.sh files and the *.sbatch job scripts) passes
# shellcheck at every severity, style included (the bench scripts run only on the GPU machine, so this is
# where their mistakes are caught): quoting, word splitting and globbing mistakes are what broke the launch
# scripts on paths with spaces and on a "*" in DIFFPIPE_MPIRUN_ARGS (issue 21).
#   bash tests/cluster/shellcheck.sh
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
command -v shellcheck >/dev/null || { echo "shellcheck is not installed (Debian package shellcheck; bash launch/setup.sh installs it)"; exit 1; }
mapfile -t scripts < <(cd "$here" && find launch cluster bench -type f \( -name '*.sh' -o -name '*.sbatch' \) | sort)
[ "${#scripts[@]}" -gt 0 ] || { echo "no scripts found under $here/launch, $here/cluster and $here/bench"; exit 1; }
cd "$here" || exit 1
if shellcheck --version | head -2 | tail -1 && shellcheck -x --severity=style "${scripts[@]}"; then
  echo "shellcheck: ${#scripts[@]} scripts clean: ${scripts[*]}"
else
  echo "shellcheck found problems in launch/, cluster/ or bench/ (above)"
  exit 1
fi
