#!/usr/bin/env bash
# Starts `diffpipe generate` over MPI ranks with Open MPI's mpirun, one rank per GPU, after checking the launch
# against the run config so that a wrong launch fails in milliseconds instead of after the weights load.
#
#   launch/mpirun.sh [-np N] [--hostfile FILE] [--dry-run] [--mpirun-arg ARG ...] --config configs/X.json
#                    [generate flags ...]
#
#   -np N           ranks; default: the config's "ranks". A different -np than the config's is refused.
#   --hostfile F    one line per node, "node1 slots=4" (slots = GPUs used on that node); without it, one node
#                   (or, inside a SLURM allocation, the allocation's nodes).
#   --dry-run       print the checks' results and the mpirun command, start nothing.
#   --mpirun-arg A  one word passed to mpirun as it is (a path with spaces stays one word); repeat for several.
#   everything else goes to `diffpipe generate` (flags there override the config's keys).
# Every number read (-np, --ranks, the config's "ranks", hostfile slots, DIFFPIPE_NODE_GPUS,
# DIFFPIPE_OOB_KEEPALIVE) is checked, and a bad one is refused with a message naming it.
#
# Environment:
#   DIFFPIPE_BIN          the diffpipe executable (default: build/diffpipe of this checkout)
#   DIFFPIPE_MPIRUN_ARGS  more mpirun options, split at spaces, never glob-expanded (e.g. "--mca plm_rsh_agent
#                         ./agent"); for a word with spaces use --mpirun-arg
#   DIFFPIPE_NET          the network MPI's TCP traffic uses between nodes: an interface (ib0, eth1) or a
#                         CIDR (10.0.0.0/24); NCCL_SOCKET_IFNAME is used when this is unset
#   DIFFPIPE_NODE_GPUS    GPUs per node, when nvidia-smi cannot tell (counted from CUDA_VISIBLE_DEVICES or
#                         `nvidia-smi -L` otherwise)
#   DIFFPIPE_OOB_KEEPALIVE "time,interval,probes" seconds for mpirun's control connections (default 5,2,5:
#                         a dead link or node ends the job within about 15 s instead of hanging it)
# NCCL_*, UCX_*, OMPI_MCA_*, CUDA_* and DIFFPIPE_* variables reach every rank.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

fail() {
  printf 'launch/mpirun.sh: error: %s\n' "$*" >&2
  exit 2
}

np="" hostfile="" config="" dry_run=0 ranks_flag="" device_flag=""
generate_args=() mpirun_words=()
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-n|--np) [ $# -ge 2 ] || fail "$1 needs a number of ranks"; np=$2; shift 2 ;;
    --mpirun-arg) [ $# -ge 2 ] || fail "--mpirun-arg needs a word for mpirun"; mpirun_words+=("$2"); shift 2 ;;
    --hostfile|-hostfile|--machinefile) [ $# -ge 2 ] || fail "$1 needs a file"; hostfile=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --config) [ $# -ge 2 ] || fail "--config needs a file"; config=$2; generate_args+=("$1" "$2"); shift 2 ;;
    --config=*) config=${1#--config=}; generate_args+=("$1"); shift ;;
    --ranks) [ $# -ge 2 ] || fail "--ranks needs a number"; ranks_flag=$2; generate_args+=("$1" "$2"); shift 2 ;;
    --ranks=*) ranks_flag=${1#--ranks=}; generate_args+=("$1"); shift ;;
    --device) [ $# -ge 2 ] || fail "--device needs cpu or cuda"; device_flag=$2; generate_args+=("$1" "$2"); shift 2 ;;
    --device=*) device_flag=${1#--device=}; generate_args+=("$1"); shift ;;
    *) generate_args+=("$1"); shift ;;
  esac
done

# A count: 1 to 999999, decimal digits only ("abc", "2.5", "99999999999999999999" and "" are not).
is_count() { [[ $1 =~ ^[1-9][0-9]{0,5}$ ]]; }
[ -z "$np" ] || is_count "$np" || fail "-np $np: expected a whole number of ranks from 1 to 999999"
[ -z "$ranks_flag" ] || [ "$ranks_flag" = 0 ] || is_count "$ranks_flag" ||
  fail "--ranks $ranks_flag: expected a whole number of ranks (0 for any)"

# What the config asks for: its "ranks" and "device" (the command line's --ranks/--device override them, as
# generate itself does), type-checked by launch/config_fields.py as generate would check them.
config_ranks="" config_device=""
if [ -n "$config" ]; then
  [ -f "$config" ] || fail "--config $config: no such file (the run configs are in $here/configs)"
  fields_file=$(mktemp)
  if ! python3 "$here/launch/config_fields.py" "$config" > "$fields_file" 2> "$fields_file.err"; then
    message=$(cat "$fields_file.err")
    rm -f "$fields_file" "$fields_file.err"
    fail "$message"
  fi
  mapfile -d '' -t config_fields < "$fields_file"
  rm -f "$fields_file" "$fields_file.err"
  config_ranks=${config_fields[0]} config_device=${config_fields[1]}
fi
wanted_ranks=${ranks_flag:-$config_ranks}
[ "$wanted_ranks" != 0 ] || wanted_ranks=""
device=${device_flag:-${config_device:-cpu}}

if [ -z "$np" ]; then
  [ -n "$wanted_ranks" ] || fail "give -np N (the config${config:+ $config} states no \"ranks\")"
  np=$wanted_ranks
elif [ -n "$wanted_ranks" ] && [ "$np" != "$wanted_ranks" ]; then
  source_name=${ranks_flag:+--ranks $ranks_flag}
  source_name=${source_name:-$config (key \"ranks\")}
  fail "-np $np, but $source_name needs $wanted_ranks rank(s): use -np $wanted_ranks or leave -np out (the" \
       "config's map and max-memory were chosen for $wanted_ranks GPUs; for $np, use a config written for $np)"
fi

# Nodes: a hostfile's lines, or this node alone (inside SLURM, mpirun takes the allocation's nodes itself).
nodes=1 ranks_per_node=$np
if [ -n "$hostfile" ]; then
  [ -f "$hostfile" ] || fail "--hostfile $hostfile: no such file. Write one line per node, e.g." \
    "'node1 slots=4' and 'node2 slots=4' (slots = GPUs on the node), or leave --hostfile out to run on this node"
  nodes=0 max_slots=0 line_number=0
  while read -r host rest || [ -n "$host" ]; do
    line_number=$((line_number + 1))
    case "$host" in ''|'#'*) continue ;; esac
    nodes=$((nodes + 1))
    slots=1
    read -r -a words <<<"$rest" || true
    for word in "${words[@]}"; do
      case "$word" in
        '#'*) break ;;
        slots=*|max_slots=*|max-slots=*)
          value=${word#*=}
          is_count "$value" || fail "--hostfile $hostfile line $line_number: $word: expected a whole number of" \
            "slots from 1 to 999999 (the GPUs used on $host)"
          case "$word" in slots=*) slots=$value ;; esac ;;
      esac
    done
    [ "$slots" -gt "$max_slots" ] && max_slots=$slots
  done < "$hostfile"
  [ "$nodes" -gt 0 ] || fail "--hostfile $hostfile names no node (one line per node: 'node1 slots=4')"
  ranks_per_node=$(( np < max_slots ? np : max_slots ))
elif [ -n "${SLURM_JOB_ID:-}" ] && [ -n "${SLURM_NNODES:-}" ]; then
  is_count "$SLURM_NNODES" || fail "SLURM_NNODES=$SLURM_NNODES: expected a whole number of nodes"
  nodes=$SLURM_NNODES
  ranks_per_node=$(( (np + nodes - 1) / nodes ))
fi

# One rank per GPU: a node must have as many GPUs as it runs ranks. The runtime gives local rank r the GPU
# r % (visible GPUs), so ranks on one node never share a GPU when this holds.
if [ "$device" = cuda ]; then
  if [ -n "${DIFFPIPE_NODE_GPUS:-}" ]; then
    [[ $DIFFPIPE_NODE_GPUS =~ ^(0|[1-9][0-9]{0,5})$ ]] ||
      fail "DIFFPIPE_NODE_GPUS=$DIFFPIPE_NODE_GPUS: expected a whole number of GPUs per node"
    gpus=$DIFFPIPE_NODE_GPUS gpu_source="DIFFPIPE_NODE_GPUS"
  elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    gpus=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .) gpu_source="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true) gpu_source="nvidia-smi -L"
  else
    gpus=0 gpu_source="no nvidia-smi on this node"
  fi
  if [ "$ranks_per_node" -gt "$gpus" ]; then
    fail "${config:-the run} puts $ranks_per_node rank(s) of one GPU each on a node, but this node has $gpus" \
         "GPU(s) ($gpu_source): use a config for $gpus GPU(s) (configs/flux-dev-${gpus}gpu.json where it exists)," \
         "spread the ranks over more nodes with --hostfile, or run on CPU with --device cpu"
  fi
fi

# Threads per rank: the node's cores shared by its ranks (LibTorch takes every core per process otherwise).
if [ -z "${OMP_NUM_THREADS:-}" ]; then
  cores=$(nproc)
  OMP_NUM_THREADS=$(( cores / ranks_per_node > 0 ? cores / ranks_per_node : 1 ))
  export OMP_NUM_THREADS
fi
# NVLink multicast (NVLS) reserves memory and fails on some drivers and MIG/partitioned GPUs; the ring sends
# point to point and gains nothing from it.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

bin=${DIFFPIPE_BIN:-$here/build/diffpipe}
[ -x "$bin" ] || fail "$bin: not built (bash launch/setup.sh, or set DIFFPIPE_BIN)"

mpirun_args=(-np "$np" --map-by slot --bind-to none)
[ -n "$hostfile" ] && mpirun_args+=(--hostfile "$hostfile")
# CPU runs in CI put more ranks than cores on a node; GPU runs were checked above.
[ "$device" = cuda ] || mpirun_args+=(--oversubscribe)
for name in $(compgen -e | grep -E '^(NCCL_|UCX_|CUDA_|DIFFPIPE_|OMP_NUM_THREADS$|OMPI_ALLOW_RUN_AS_ROOT)' || true); do
  mpirun_args+=(-x "$name")
done
net=${DIFFPIPE_NET:-${NCCL_SOCKET_IFNAME:-}}
if [ -n "$net" ] && [[ $net != ^* ]]; then
  mpirun_args+=(--mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net")
fi
if [ "$nodes" -gt 1 ]; then
  IFS=, read -r ka_time ka_intvl ka_probes <<<"${DIFFPIPE_OOB_KEEPALIVE:-5,2,5}"
  for value in "$ka_time" "$ka_intvl" "$ka_probes"; do
    is_count "$value" || fail "DIFFPIPE_OOB_KEEPALIVE=${DIFFPIPE_OOB_KEEPALIVE:-}: expected three whole numbers" \
      "\"time,interval,probes\" (seconds, seconds, count), e.g. 5,2,5"
  done
  mpirun_args+=(--mca oob_tcp_keepalive_time "$ka_time" --mca oob_tcp_keepalive_intvl "$ka_intvl"
                --mca oob_tcp_keepalive_probes "$ka_probes")
fi
# Split at white space, never glob-expanded: a "*" in DIFFPIPE_MPIRUN_ARGS reaches mpirun as "*".
extra=()
read -r -d '' -a extra <<<"${DIFFPIPE_MPIRUN_ARGS:-}" || true
extra+=("${mpirun_words[@]}")

echo "launch/mpirun.sh: $np rank(s) on $nodes node(s), $ranks_per_node per node, device $device," \
     "$OMP_NUM_THREADS thread(s) per rank${config:+, config $config}" >&2
if [ "$device" = cuda ]; then
  echo "launch/mpirun.sh: local rank r uses GPU r of its node (0..$((ranks_per_node - 1)))" >&2
fi
command=(mpirun "${mpirun_args[@]}" "${extra[@]}" "$bin" generate "${generate_args[@]}")
if [ "$dry_run" = 1 ]; then
  printf '%q ' "${command[@]}"
  echo
  exit 0
fi
exec "${command[@]}"
