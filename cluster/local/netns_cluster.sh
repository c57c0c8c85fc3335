# shellcheck shell=bash
# Several "hosts" on this machine, made of network namespaces: a namespace holding a bridge (the switch) and
# per host a namespace with a veth into it, in a private subnet that exists only on those veths. Open MPI
# reaches the hosts through an rsh agent that enters the host's namespace with its own hostname (UTS), so
# shared-memory segment names do not collide between hosts. Sourced by cluster/local/test.sh and
# cluster/slurm/test.sh; needs root, iproute2 and util-linux (unshare, nsenter).
#
#   netns_cluster_up NAME_PREFIX SUBNET_PREFIX HOSTS WORKDIR   e.g. dpl4242 10.201.42 2 /tmp/x
#       creates namespaces ${NAME_PREFIX}sw and ${NAME_PREFIX}h1..hN, host i at ${SUBNET_PREFIX}.i/24, and in
#       WORKDIR: rsh-agent (usage: rsh-agent HOST COMMAND...) and hostfile (hI slots=2 per host)
#   netns_on HOST COMMAND...         runs COMMAND in host HOST (h1, h2 ...), hostname HOST
#   netns_link HOST up|down          plugs or pulls HOST's cable (its veth end on the switch)
#   netns_pids HOST                  PIDs of the processes in HOST's network namespace
#   netns_cluster_down               kills what runs in the namespaces, deletes them; safe to call twice
#   netns_test_verdict PREFIX TMP    a test's last line: fails on what its teardown left or on $failures
# Names and subnets come from the caller so that tests running at the same time do not collide.

netns_prefix="" netns_subnet="" netns_hosts=0 netns_dir=""

netns_cluster_up() {
  netns_prefix=$1 netns_subnet=$2 netns_hosts=$3 netns_dir=$4
  local sw=${netns_prefix}sw i
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  ip -n "$sw" link set lo up
  for i in $(seq 1 "$netns_hosts"); do
    local host=${netns_prefix}h$i
    ip netns add "$host"
    # veth: "eth0" inside the host, "pI" on the switch (names live in their namespaces, so runs never clash).
    ip link add "${netns_prefix}a$i" type veth peer name "${netns_prefix}b$i"
    ip link set "${netns_prefix}a$i" netns "$host"
    ip link set "${netns_prefix}b$i" netns "$sw"
    ip -n "$host" link set "${netns_prefix}a$i" name eth0
    ip -n "$sw" link set "${netns_prefix}b$i" name "p$i"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$host" addr add "$netns_subnet.$i/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" link set lo up
    # TCP retries unacknowledged data for ~15 min by default (tcp_retries2=15), and keepalives only probe
    # idle connections: once mpirun sends to a host whose cable is gone (MPI_Abort's kill orders) it would
    # wait that long. 3 retries give up after about 6 s, as a cluster's nodes should be set (README).
    ip netns exec "$host" sysctl -q -w net.ipv4.tcp_retries2=3
  done
  mkdir -p "$netns_dir"
  cat > "$netns_dir/rsh-agent" <<EOF
#!/bin/sh
# rsh agent for mpirun: rsh-agent HOST COMMAND..., run inside HOST's namespace with HOST as its hostname.
host=\$1
shift
exec ip netns exec "${netns_prefix}\$host" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
  chmod +x "$netns_dir/rsh-agent"
  : > "$netns_dir/hostfile"
  for i in $(seq 1 "$netns_hosts"); do echo "h$i slots=2" >> "$netns_dir/hostfile"; done
}

netns_on() {
  local host=$1
  shift
  # `ip netns exec` remounts /sys for the namespace, so slurmd (which needs /sys/fs/cgroup) runs under
  # nsenter instead; both give the same network.
  # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
  nsenter --net="/run/netns/${netns_prefix}$host" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

netns_link() {
  ip -n "${netns_prefix}sw" link set "p${1#h}" "$2"
}

netns_pids() {
  ip netns pids "${netns_prefix}$1" 2>/dev/null || true
}

netns_tx_bytes() {
  ip netns exec "${netns_prefix}$1" cat /sys/class/net/eth0/statistics/tx_bytes
}

netns_cluster_down() {
  [ -n "$netns_prefix" ] || return 0
  local i ns pid
  for i in $(seq 1 "$netns_hosts") sw; do
    ns=${netns_prefix}$([ "$i" = sw ] && echo sw || echo "h$i")
    ip netns list 2>/dev/null | grep -qw "^$ns" || continue
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for i in $(seq 1 "$netns_hosts") sw; do
    ns=${netns_prefix}$([ "$i" = sw ] && echo sw || echo "h$i")
    ip netns del "$ns" 2>/dev/null || true
  done
  netns_prefix=""
}

# The end of a cluster test, after the caller's cleanup. What the teardown left counts as one more failure:
# namespaces named PREFIX..., the temp dir TMP, processes with TMP on their command line (every rank, daemon and
# agent of a run has the temp dir, or the model in it, there). Exits 1 when the caller's $failures is above 0;
# says so through the caller's say.
netns_test_verdict() {
  local prefix=$1 tmp=$2 leaks=""
  ip netns list | grep -q "^$prefix" && leaks+=" namespaces"
  [ -e "$tmp" ] && leaks+=" $tmp"
  pgrep -f "$tmp" >/dev/null 2>&1 && leaks+=" processes: $(pgrep -af "$tmp" | head -3)"
  if [ -n "$leaks" ]; then
    say "FAIL teardown left:$leaks"
    failures=$((failures + 1))
  fi
  if [ "$failures" -gt 0 ]; then
    say "$failures case(s) failed"
    exit 1
  fi
  say "all cases passed"
}
