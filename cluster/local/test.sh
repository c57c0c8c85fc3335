#!/usr/bin/env bash
# A two-host cluster made of network namespaces on this machine (netns_cluster.sh), with `diffpipe generate`
# started across it by launch/mpirun.sh through an rsh agent, TCP only. Cases:
#   equal        2 hosts x 2 ranks give packed latents bit-identical to one process (CPU, fp32), and the
#                second host's link carried the ring's traffic
#   killed-rank  a rank on the second host killed with SIGKILL mid-run ends the job non-zero within 30 s,
#                the output naming that rank
#   pulled-link  the second host's cable pulled mid-run ends the job non-zero within 30 s (generate's
#                --transport-timeout, mpirun's keepalive), the output naming a rank of that host
# Starts from nothing (root, iproute2, Open MPI, a built diffpipe), tears everything down (no namespace,
# process or temp dir left, checked), exits 0 only if every case passed.
#   bash cluster/local/test.sh            DIFFPIPE_BIN=... to test another build
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
source "$here/cluster/local/netns_cluster.sh"

bin=${DIFFPIPE_BIN:-$here/build/diffpipe}
bound_seconds=30
transport_timeout=6
say() { printf '[local] %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { say "needs root (network namespaces)"; exit 1; }
for tool in ip nsenter unshare mpirun h5diff; do
  command -v "$tool" >/dev/null || { say "missing $tool: bash launch/setup.sh installs it"; exit 1; }
done
[ -x "$bin" ] || { say "$bin is not built"; exit 1; }

# Unique per run: ctest may run this beside cluster/slurm/test.sh, which uses 10.202.x.
prefix=dpl$$
subnet=10.201.$(( $$ % 250 + 1 ))
tmp=$(mktemp -d /tmp/diffpipe-local.XXXXXX)
job_pid=""

cleanup() {
  [ -n "$job_pid" ] && kill -9 "$job_pid" 2>/dev/null
  # DIFFPIPE_TEST_LOGS=DIR keeps the runs' logs for a look after the teardown.
  [ -n "${DIFFPIPE_TEST_LOGS:-}" ] && mkdir -p "$DIFFPIPE_TEST_LOGS" && cp "$tmp"/*.log "$DIFFPIPE_TEST_LOGS"/ 2>/dev/null
  netns_cluster_down
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

netns_cluster_up "$prefix" "$subnet" 2 "$tmp/cluster"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# mpirun's keepalive (10 s idle, then 3 probes 2 s apart: 16 s) ends a run whose link is gone even when no
# rank notices; it is longer than generate's --transport-timeout, so that the runtime, which knows which
# rank went silent, reports first.
export DIFFPIPE_BIN=$bin DIFFPIPE_NET=$subnet.0/24 DIFFPIPE_OOB_KEEPALIVE=10,2,3
export DIFFPIPE_MPIRUN_ARGS="--mca plm_rsh_agent $tmp/cluster/rsh-agent --mca btl tcp,self --mca orte_tmpdir_base $tmp/orte"
mkdir -p "$tmp/orte"

"$bin" make-tiny --out "$tmp/tiny" >/dev/null 2>&1 || { say "make-tiny failed"; exit 1; }
# The demo config's request, more images so that the ring has work for four stages.
request=(--config "$here/configs/tiny-demo.json" --model "$tmp/tiny" --num-images-per-prompt 2
         --transport-timeout "$transport_timeout")

failures=0
pass() { say "PASS $1"; }
failed() { say "FAIL $1"; failures=$((failures + 1)); }

# Runs launch/mpirun.sh on host h1 over both hosts (4 ranks): mpirun must start inside a host namespace.
launch() {
  netns_on h1 "$here/launch/mpirun.sh" -np 4 --hostfile "$tmp/cluster/hostfile" "$@"
}

# Bit-identical: h5diff compares the stored values themselves (-d 0: any difference counts); h5dump's text
# keeps 6 significant digits and cannot tell float32 values one ulp apart.
same_latents() { h5diff -q -d 0 "$1" "$2" /latents /latents > /dev/null 2>&1; }

case_equal() {
  if ! "$bin" generate "${request[@]}" --out "$tmp/one.h5" > "$tmp/one.log" 2>&1; then
    failed "equal: one process failed: $(tail -3 "$tmp/one.log")"
    return
  fi
  local before after
  before=$(netns_tx_bytes h2)
  if ! launch "${request[@]}" --out "$tmp/four.h5" > "$tmp/four.log" 2>&1; then
    failed "equal: 2 hosts x 2 ranks failed: $(tail -5 "$tmp/four.log")"
    return
  fi
  after=$(netns_tx_bytes h2)
  if ! same_latents "$tmp/one.h5" "$tmp/four.h5"; then
    failed "equal: the latents of 2 hosts x 2 ranks differ from one process"
    return
  fi
  # The last stage (rank 3, on h2) returns every noise prediction to rank 0 on h1 over the veth: at least
  # the latents' size per step.
  local sent=$((after - before)) latent_bytes
  latent_bytes=$(stat -c %s "$tmp/one.h5")
  if [ "$sent" -lt "$latent_bytes" ]; then
    failed "equal: h2 sent $sent bytes, less than one copy of the latents ($latent_bytes): the ranks did not span both hosts"
    return
  fi
  pass "equal: 2 hosts x 2 ranks bit-identical to one process ($sent bytes from h2)"
}

# Starts a long run in the background and returns once rank 0 reports its first denoising step.
start_long_run() {
  local log=$1
  launch "${request[@]}" --steps 1000 --out "$tmp/long.h5" > "$log" 2>&1 &
  job_pid=$!
  local waited=0
  until grep -q "progress 1/1000" "$log" 2>/dev/null; do
    if ! kill -0 "$job_pid" 2>/dev/null; then return 1; fi
    [ $waited -lt 600 ] || return 1  # 60 s to start four ranks on a loaded machine
    sleep 0.1
    waited=$((waited + 1))
  done
}

# Waits for the background run; sets `code` (its exit code, or "hung") and `seconds`. Gives up after the
# bound plus a margin.
wait_for_end() {
  local started=$1
  for _ in $(seq 1 $(( (bound_seconds + 15) * 10 ))); do
    kill -0 "$job_pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$job_pid" 2>/dev/null; then
    kill -9 "$job_pid" 2>/dev/null
    wait "$job_pid" 2>/dev/null
    code=hung
  else
    wait "$job_pid"
    code=$?
  fi
  seconds=$(( $(date +%s) - started ))
  job_pid=""
}

# The ranks (OMPI_COMM_WORLD_RANK) of the diffpipe processes running on a host, as "pid:rank" lines.
ranks_on() {
  local pid
  for pid in $(netns_pids "$1"); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = diffpipe-torch ] || continue
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | sed -n "s/^OMPI_COMM_WORLD_RANK=/$pid:/p"
  done
}

# After a fault the hosts must hold no rank or daemon (zombies are reaped within a second or two).
leftovers_after_fault() {
  local host pid left=""
  for _ in $(seq 1 50); do
    left=""
    for host in h1 h2; do
      for pid in $(netns_pids "$host"); do
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] || left+=" $pid($(cat "/proc/$pid/comm" 2>/dev/null))"
      done
    done
    [ -z "$left" ] && return 0
    sleep 0.2
  done
  echo "$left"
}

case_killed_rank() {
  local log=$tmp/killed.log
  if ! start_long_run "$log"; then
    failed "killed-rank: the run did not start: $(tail -5 "$log")"
    return
  fi
  local victim
  victim=$(ranks_on h2 | head -1)
  if [ -z "$victim" ]; then
    failed "killed-rank: no rank runs on h2"
    return
  fi
  local started
  started=$(date +%s)
  kill -9 "${victim%%:*}"
  wait_for_end "$started"
  local rank=${victim##*:}
  if [ "$code" = hung ] || [ "$code" = 0 ] || [ "$seconds" -gt "$bound_seconds" ]; then
    failed "killed-rank: exit $code after ${seconds}s (expected non-zero within ${bound_seconds}s)"
  # mpirun's report: "process rank R with PID P on node h2 exited on signal 9".
  elif ! grep -q "process rank $rank .*on node h2" "$log"; then
    failed "killed-rank: exit $code after ${seconds}s, but the output does not name rank $rank: $(tail -5 "$log")"
  else
    pass "killed-rank: rank $rank killed on h2, job ended with $code after ${seconds}s naming it"
  fi
  local left
  left=$(leftovers_after_fault) || true
  [ -z "$left" ] || failed "killed-rank: processes left on the hosts:$left"
}

case_pulled_link() {
  local log=$tmp/pulled.log
  if ! start_long_run "$log"; then
    failed "pulled-link: the run did not start: $(tail -5 "$log")"
    return
  fi
  local h2_ranks started
  h2_ranks=$(ranks_on h2 | sed 's/.*://' | sort -n | tr '\n' ' ')
  started=$(date +%s)
  netns_link h2 down
  wait_for_end "$started"
  netns_link h2 up
  local named=""
  # The runtime's bound: "rank R: no ... from rank P within N s (--transport-timeout): rank P ..."
  for rank in $h2_ranks; do grep -Eq "from rank $rank within [0-9]+ s \(--transport-timeout\)" "$log" && named+="$rank "; done
  if [ "$code" = hung ] || [ "$code" = 0 ] || [ "$seconds" -gt "$bound_seconds" ]; then
    failed "pulled-link: exit $code after ${seconds}s (expected non-zero within ${bound_seconds}s): $(tail -5 "$log")"
  elif [ -z "$named" ]; then
    failed "pulled-link: exit $code after ${seconds}s, but the output names none of h2's ranks ($h2_ranks): $(tail -8 "$log")"
  else
    pass "pulled-link: h2's link pulled, job ended with $code after ${seconds}s naming rank(s) $named"
  fi
  # The ranks cut off on h2 end when their daemon loses mpirun; the teardown kills any that did not.
}

case_equal
case_killed_rank
case_pulled_link

cleanup
trap - EXIT
netns_test_verdict "$prefix" "$tmp"
