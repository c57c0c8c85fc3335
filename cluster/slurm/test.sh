#!/usr/bin/env bash
# A real SLURM (Debian's slurmctld, slurmd, munge) started by this script, used, and torn down:
#   one node on loopback:
#     srun            CONFIG=tiny-demo sbatch cluster/slurm/generate.sbatch -n 2: exit 0, latents bit-identical
#                     to one process
#     mpirun          the same through cluster/slurm/generate-mpirun.sbatch
#     out-dir         both scripts with no --out anywhere and an OUT_DIR with a space: the result is
#                     OUT_DIR/diffpipe-JOBID.h5 (or the config's relative "out" inside OUT_DIR), nothing lands in
#                     the submit folder, and two jobs never share an output
#     wrong-ranks     a config for 3 ranks in a 2-task job: the job ends at once with exit 2 and a fix-it line
#     no-pmix         srun --mpi=none: generate fails fast naming --mpi=pmix
#     requeue         a job warned of preemption (SIGUSR1 to the batch shell, as --signal=B:USR1@ delivers it)
#                     checkpoints, requeues itself, resumes and ends with latents bit-identical to an
#                     uninterrupted run (needs generate's --checkpoint-dir/--resume)
#   two nodes on network-namespace hosts (cluster/local/netns_cluster.sh):
#     two-nodes       sbatch -N 2 -n 4 through srun and through mpirun: ranks on both nodes, latents equal
# The sbatch scripts run as they are in cluster/slurm. Exits 0 only if every case passed; leaves no daemon,
# namespace or temp dir (checked).
#   bash cluster/slurm/test.sh            DIFFPIPE_BIN=... to test another build
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
source "$here/cluster/local/netns_cluster.sh"
bin=${DIFFPIPE_BIN:-$here/build/diffpipe}
say() { printf '[slurm] %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { say "needs root (daemons as root, network namespaces)"; exit 1; }
for tool in slurmctld slurmd munged sbatch srun scontrol sinfo mpirun h5diff ip nsenter; do
  command -v "$tool" >/dev/null || { say "missing $tool: bash launch/setup.sh installs it"; exit 1; }
done
[ -x "$bin" ] || { say "$bin is not built"; exit 1; }

tmp=$(mktemp -d /tmp/diffpipe-slurm.XXXXXX)
chmod 755 "$tmp"
# Unique per run (ctest runs cluster/local/test.sh beside this one, on 10.201.x).
prefix=dps$$
subnet=10.202.$(( $$ % 250 + 1 ))
port=$(( 20000 + ($$ % 2000) * 2 ))
daemon_pids=() munge_pid=""

stop_daemons() {  # the SLURM daemons of a phase
  local pid
  for pid in "${daemon_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${daemon_pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  daemon_pids=()
}
cleanup() {
  # DIFFPIPE_TEST_LOGS=DIR keeps the jobs' and daemons' logs for a look after the teardown.
  if [ -n "${DIFFPIPE_TEST_LOGS:-}" ] && [ -d "$tmp" ]; then
    mkdir -p "$DIFFPIPE_TEST_LOGS"
    (cd "$tmp" && find . -name '*.log' -o -name '*.out' -o -name 'stderr' | while read -r f; do mkdir -p "$DIFFPIPE_TEST_LOGS/$(dirname "$f")" && cp "$f" "$DIFFPIPE_TEST_LOGS/$f"; done)
  fi
  stop_daemons
  [ -n "$munge_pid" ] && kill "$munge_pid" 2>/dev/null && wait "$munge_pid" 2>/dev/null
  munge_pid=""
  netns_cluster_down
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

failures=0
pass() { say "PASS $1"; }
failed() { say "FAIL $1"; failures=$((failures + 1)); }

# munge: one daemon for both phases (its socket is a file, reachable from every network namespace).
mkdir -p "$tmp/munge"
chmod 755 "$tmp/munge"
head -c 1024 /dev/urandom > "$tmp/munge/key"
chmod 400 "$tmp/munge/key"
# Every daemon runs in the foreground as a child of this script, so that its PID is known at once and the
# teardown can end exactly the daemons this run started.
munged -F --key-file "$tmp/munge/key" --socket "$tmp/munge/socket" --log-file "$tmp/munge/log" \
  --pid-file "$tmp/munge/pid" --seed-file "$tmp/munge/seed" > "$tmp/munge/out" 2>&1 &
munge_pid=$!
for _ in $(seq 1 50); do [ -S "$tmp/munge/socket" ] && break; sleep 0.1; done
[ -S "$tmp/munge/socket" ] || { say "munged did not start: $(cat "$tmp/munge/log")"; exit 1; }

# slurm.conf for the nodes given as "name:address" words; the controller runs on the first.
write_slurm_conf() {
  local dir=$1 ctld=$2
  shift 2
  local first=${1%%:*} node
  mkdir -p "$dir/state" "$dir/log"
  cat > "$dir/slurm.conf" <<EOF
ClusterName=diffpipe-test
SlurmctldHost=${first}(${ctld})
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobRequeue=1
KillWait=5
MinJobAge=600
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
TmpFS=$dir/tmp/%n
EOF
  for node in "$@"; do
    echo "NodeName=${node%%:*} NodeAddr=${node#*:} CPUs=4 State=UNKNOWN" >> "$dir/slurm.conf"
    mkdir -p "$dir/spool/${node%%:*}" "$dir/tmp/${node%%:*}"
  done
  local names
  names=$(for node in "$@"; do printf '%s,' "${node%%:*}"; done)
  echo "PartitionName=test Nodes=${names%,} Default=YES MaxTime=INFINITE State=UP" >> "$dir/slurm.conf"
}

# Waits until `count` nodes are idle (sinfo through `$@`, e.g. netns_on h1).
wait_idle() {
  local count=$1
  shift
  for _ in $(seq 1 300); do
    [ "$("$@" sinfo -h -o '%T %D' 2>/dev/null | awk '$1=="idle"{n+=$2} END{print n+0}')" -ge "$count" ] && return 0
    sleep 0.1
  done
  say "nodes not idle after 30 s: $("$@" sinfo -h 2>&1)"
  return 1
}

"$bin" make-tiny --out "$tmp/tiny" >/dev/null 2>&1 || { say "make-tiny failed"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export DIFFPIPE_BIN=$bin DIFFPIPE_HOME=$here CONFIG=$here/configs/tiny-demo.json MODEL=$tmp/tiny
# Bit-identical: h5diff compares the stored values themselves (-d 0: any difference counts); h5dump's text
# keeps 6 significant digits and cannot tell float32 values one ulp apart.
same_latents() { h5diff -q -d 0 "$1" "$2" /latents /latents > /dev/null 2>&1; }
reference() {  # one process, the same request: the latents every job must give
  local out=$1
  shift
  "$bin" generate --config "$CONFIG" --model "$MODEL" --out "$out" "$@" > "$out.log" 2>&1
}
reference "$tmp/reference.h5" || { say "the one-process reference failed: $(tail -3 "$tmp/reference.h5.log")"; exit 1; }

# Submits an sbatch script with --wait through `$runner` (empty, or netns_on h1); returns the job's exit
# code, or 124 when it has not ended within job_bound seconds (then it is cancelled).
job_bound=${DIFFPIPE_JOB_BOUND:-240}
submit_wait() {
  local runner=$1 log=$2 code pid
  shift 2
  # -c 1: the scripts ask for 8 CPUs per rank, more than the test nodes declare for 2 ranks.
  # shellcheck disable=SC2094  # sbatch only names the log for the job; its own errors are appended
  $runner sbatch --wait --parsable -c 1 -o "$log" "$@" > "$log.id" 2>>"$log" &
  pid=$!
  for _ in $(seq 1 $((job_bound * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    $runner scancel "$(head -1 "$log.id")" 2>/dev/null
    echo "(no end within $job_bound s; cancelled)" >> "$log"
    return 124
  fi
  wait "$pid"
}

case_job() {  # name runner script sbatch-options...: a job that must succeed with the reference latents
  local name=$1 runner=$2 script=$3
  shift 3
  local out=$tmp/$name
  mkdir -p "$out"
  if ! OUT_DIR=$out GENERATE_ARGS="--out $out/latents.h5" submit_wait "$runner" "$out/job.log" "$@" "$here/cluster/slurm/$script"; then
    failed "$name: the job failed: $(tail -8 "$out/job.log"; tail -3 "$out"/logs/run0/rank0.log 2>/dev/null)"
    return 1
  fi
  if ! same_latents "$tmp/reference.h5" "$out/latents.h5"; then
    failed "$name: the job's latents differ from one process"
    return 1
  fi
  pass "$name: job $(cat "$out/job.log.id") exit 0, latents bit-identical to one process"
}

# The sbatch scripts as a user submits them, without --out: outputs must land inside OUT_DIR (a path with a
# space), named by the job where the config has no "out", and never in the submit folder (issue 21, case 3).
case_out_dir() {  # name script config expected-name(JOBID replaced) sbatch-options...
  local name=$1 script=$2 config=$3 expected=$4
  shift 4
  local out="$tmp/$name/out dir" submit=$tmp/$name/submit job
  mkdir -p "$out" "$submit"
  if ! (cd "$submit" && CONFIG=$config OUT_DIR=$out GENERATE_ARGS="" \
        submit_wait "" "$tmp/$name/job.log" "$@" "$here/cluster/slurm/$script"); then
    failed "$name: the job failed: $(tail -8 "$tmp/$name/job.log")"
    return 1
  fi
  job=$(head -1 "$tmp/$name/job.log.id")
  expected=${expected//JOBID/$job}
  if [ ! -f "$out/$expected" ]; then
    failed "$name: no $expected in OUT_DIR ($(find "$out" -maxdepth 1 | tr '\n' ' '))"
  elif [ -n "$(find "$submit" -mindepth 1)" ]; then
    failed "$name: the job wrote into the submit folder: $(find "$submit" -mindepth 1 | tr '\n' ' ')"
  elif ! same_latents "$tmp/reference.h5" "$out/$expected"; then
    failed "$name: the job's latents differ from one process"
  else
    pass "$name: job $job wrote OUT_DIR/$expected (OUT_DIR with a space), nothing in the submit folder"
  fi
}

###### Phase 1: one node on loopback
one=$tmp/one
node=$(hostname -s)
write_slurm_conf "$one" 127.0.0.1 "$node:127.0.0.1"
export SLURM_CONF=$one/slurm.conf
slurmctld -D -c -f "$SLURM_CONF" > "$one/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" > "$one/log/slurmd.out" 2>&1 &
daemon_pids+=($!)
if wait_idle 1; then
  case_job srun "" generate.sbatch -n 2
  case_job mpirun "" generate-mpirun.sbatch -n 2
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("out"); json.dump(d, open(sys.argv[2], "w"))' \
    "$CONFIG" "$tmp/no-out.json"
  case_out_dir out-dir-srun generate.sbatch "$tmp/no-out.json" diffpipe-JOBID.h5 -n 2
  case_out_dir out-dir-mpirun generate-mpirun.sbatch "$CONFIG" tiny-demo.h5 -n 2

  # A config's world size against the job's: fails in the job script, before any rank starts.
  sed 's/"device": "cpu"/"ranks": 3, "device": "cpu"/' "$CONFIG" > "$tmp/three-ranks.json"
  started=$(date +%s)
  CONFIG=$tmp/three-ranks.json OUT_DIR=$tmp/wrong submit_wait "" "$tmp/wrong.log" -n 2 "$here/cluster/slurm/generate.sbatch"
  code=$?
  if [ "$code" = 2 ] && grep -q "needs 3 rank(s).*sbatch -n 3" "$tmp/wrong.log"; then
    pass "wrong-ranks: exit 2 after $(( $(date +%s) - started ))s: $(grep -o 'error: .*' "$tmp/wrong.log" | head -1 | cut -c1-110)"
  else
    failed "wrong-ranks: exit $code: $(tail -3 "$tmp/wrong.log")"
  fi

  # srun without PMIx: every task would be a world of one; generate must say so and end.
  started=$(date +%s)
  timeout 60 srun --mpi=none -n 2 "$bin" generate --config "$CONFIG" --model "$MODEL" --out "$tmp/nopmix.h5" \
    > "$tmp/nopmix.log" 2>&1
  code=$?
  if [ "$code" != 0 ] && [ "$code" != 124 ] && grep -q -- "--mpi=pmix" "$tmp/nopmix.log" && [ ! -e "$tmp/nopmix.h5" ]; then
    pass "no-pmix: srun --mpi=none ended with $code after $(( $(date +%s) - started ))s naming --mpi=pmix"
  else
    failed "no-pmix: exit $code: $(tail -4 "$tmp/nopmix.log")"
  fi

  # Requeue: the preemption warning mid-run -> checkpoint (exit 75) -> scontrol requeue -> resume.
  # Long enough (1000 steps of 256x384, ~15 s) that the warning lands mid-run.
  steps=1000
  long=(--steps "$steps" --height 256 --width 384)
  reference "$tmp/reference-long.h5" "${long[@]}" || failed "requeue: the uninterrupted run failed"
  out=$tmp/requeue
  mkdir -p "$out"
  job=$(OUT_DIR=$out CHECKPOINT_EVERY=100 GENERATE_ARGS="${long[*]} --out $out/latents.h5" \
        sbatch --parsable -n 2 -c 1 -o "$out/job.log" "$here/cluster/slurm/generate.sbatch")
  for _ in $(seq 1 600); do grep -q "progress 5/$steps" "$out/logs/run0/rank0.log" 2>/dev/null && break; sleep 0.1; done
  scancel --signal=USR1 --batch "$job"
  state="" restarts=0 pending=0
  for _ in $(seq 1 1200); do
    info=$(scontrol show job "$job" 2>/dev/null)
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
    restarts=$(sed -n 's/.*Restarts=\([0-9]*\).*/\1/p' <<<"$info")
    # A requeued job waits cred_expire + 1 s (11 s here) before it may start again. Started at once, its
    # step could meet the previous run's step still being torn down on the node ("aborted before step
    # completely launched"): start it after 4 s instead.
    if [ "$state" = PENDING ] && [ "${restarts:-0}" -gt 0 ]; then
      pending=$((pending + 1))
      [ "$pending" = 40 ] && scontrol update JobId="$job" StartTime=now 2>/dev/null
    fi
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
    sleep 0.1
  done
  exit_code=$(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<<"$info" | head -1)
  if [ "$state" != COMPLETED ] || [ "${restarts:-0}" -lt 1 ]; then
    failed "requeue: job $job ended $state (exit $exit_code) after $restarts requeue(s): $(tail -6 "$out/job.log")"
  elif ! grep -q "resuming from" "$out/job.log"; then
    failed "requeue: job $job was requeued but its rerun did not resume from a checkpoint"
  elif grep -q "progress 1/$steps " "$out/logs/run1/rank0.log" 2>/dev/null; then
    failed "requeue: job $job's rerun started again from step 1 instead of resuming from its checkpoint"
  elif ! same_latents "$tmp/reference-long.h5" "$out/latents.h5"; then
    failed "requeue: the resumed job's latents differ from the uninterrupted run"
  else
    pass "requeue: job $job checkpointed, was requeued ($restarts), resumed and matches the uninterrupted run"
  fi
  scancel "$job" 2>/dev/null
else
  # A phase that never ran is a failure, not a pass.
  failed "phase 1 (srun, mpirun, wrong-ranks, no-pmix, requeue): the one-node cluster never became idle"
fi
stop_daemons

###### Phase 2: two nodes on network-namespace hosts
two=$tmp/two
netns_cluster_up "$prefix" "$subnet" 2 "$tmp/hosts"
write_slurm_conf "$two" "$subnet.1" "h1:$subnet.1" "h2:$subnet.2"
export SLURM_CONF=$two/slurm.conf
netns_on h1 slurmctld -D -c -f "$SLURM_CONF" > "$two/log/slurmctld.out" 2>&1 &
daemon_pids+=($!)
for host in h1 h2; do
  netns_on "$host" slurmd -D -f "$SLURM_CONF" -N "$host" > "$two/log/slurmd.$host.out" 2>&1 &
  daemon_pids+=($!)
done
if wait_idle 2 netns_on h1; then
  # MPI's TCP between the hosts: their subnet only.
  export OMPI_MCA_btl_tcp_if_include=$subnet.0/24 OMPI_MCA_oob_tcp_if_include=$subnet.0/24 OMPI_MCA_btl=tcp,self
  for script in generate.sbatch generate-mpirun.sbatch; do
    name=two-nodes-${script%.sbatch}
    before=$(netns_tx_bytes h2)
    if case_job "$name" "netns_on h1" "$script" -N 2 -n 4 --ntasks-per-node=2; then
      sent=$(( $(netns_tx_bytes h2) - before ))
      nodes=$(netns_on h1 scontrol show job "$(cat "$tmp/$name/job.log.id")" | sed -n 's/^ *NodeList=//p')
      if [ "$nodes" = "h[1-2]" ] && [ "$sent" -gt "$(stat -c %s "$tmp/reference.h5")" ]; then
        pass "$name: spanned $nodes, $sent bytes from h2"
      else
        failed "$name: NodeList=$nodes, $sent bytes from h2: the job did not span both nodes"
      fi
    fi
  done
else
  failed "phase 2 (two-nodes through srun and mpirun): the two-node cluster never became idle"
fi
stop_daemons

cleanup
trap - EXIT
netns_test_verdict "$prefix" "$tmp"
