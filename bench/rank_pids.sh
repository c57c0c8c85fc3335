# shellcheck shell=bash
# Sourced by bench/gpu_build.sh and bench/gpu_check.sh (the kill-a-rank checks on the GPU machine).
# rank_pids RANK: the diffpipe-torch processes of MPI rank RANK on this machine, one pid a line.
rank_pids() {
  python3 - "$1" <<'PY'
import os, pathlib, sys
for proc in pathlib.Path("/proc").iterdir():
    try:
        if os.readlink(proc / "exe").endswith("diffpipe-torch") and \
           f"OMPI_COMM_WORLD_RANK={sys.argv[1]}".encode() in (proc / "environ").read_bytes().split(b"\0"):
            print(proc.name)
    except OSError:
        pass
PY
}
