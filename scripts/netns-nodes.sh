#!/usr/bin/env bash
# Nodes that are really separate, on one machine: N network namespaces, each with its own network
# stack (one veth to a bridge in the root namespace, 10.77.0.(10+i)/24) and, for every process an
# MPI launch starts there, its own UTS namespace whose hostname is the node's name. Ranks on one
# node share memory; ranks on different nodes talk TCP over the veths, which `tc tbf` can slow to
# a cluster's inter-node rate. Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN).
#
#   scripts/netns-nodes.sh up N [RATE]    make gcnode1..gcnodeN (RATE e.g. 1gbit: each direction
#                                         of every node's link; default: unshaped)
#   scripts/netns-nodes.sh down           remove them (also what a failed `up` left)
#   scripts/netns-nodes.sh check          exit 0 when this machine allows it, else say which call failed
#   scripts/netns-nodes.sh mpirun N PPN ARGS...
#                                         mpirun ARGS with PPN ranks on each of gcnode1..gcnodeN,
#                                         launched through this script as OpenMPI's rsh agent;
#                                         PPN may list one count per node (3,1: uneven nodes)
#   scripts/netns-nodes.sh mpirun-on HOSTS ARGS...
#                                         the same on the nodes HOSTS names (NAME:RANKS,...; what
#                                         gpucloud-run's {hosts} fills in)
#   scripts/netns-nodes.sh probe NODE     exit 0 when NODE exists and its link carries a ping to
#                                         the bridge within a second (gpucloud-run's --node-check)
#   scripts/netns-nodes.sh agent NODE CMD (OpenMPI's plm_rsh_agent: runs CMD, a remote shell's
#                                         command line, in NODE's namespaces)
#
# Only the namespaces' own addresses (10.77.0.0/24) and loopback are used: OpenMPI's out-of-band
# and TCP transports are restricted to that subnet. GPUCLOUD_NETNS_PREFIX renames the nodes
# (default gcnode) and GPUCLOUD_NETNS_SUBNET the first three octets (default 10.77.0).
set -euo pipefail
prefix="${GPUCLOUD_NETNS_PREFIX:-gcnode}"
subnet="${GPUCLOUD_NETNS_SUBNET:-10.77.0}"
bridge="${prefix}br"
here="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true; }

down() {
  # Processes still inside (a job that was cut off) would keep a namespace, and its veth, alive.
  for n in $(nodes); do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${prefix}v[0-9]+$"); do
    ip link del "$v" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

shape() { # shape DEV-COMMAND... : tbf at RATE on a device's egress
  local rate=$1
  shift
  "$@" root tbf rate "$rate" burst 256kb latency 100ms
}

up() {
  local count=$1 rate=${2:-}
  down
  ip link add "$bridge" type bridge
  # A fixed address: a bridge otherwise takes its ports' lowest, and a node removed (a node-loss
  # test) would change it under the other nodes' ARP caches, cutting them off for a while.
  IFS=. read -r a b c <<<"$subnet"
  ip link set "$bridge" address "$(printf '02:%02x:%02x:%02x:00:01' "$a" "$b" "$c")"
  ip addr add "${subnet}.1/24" dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq 1 "$count"); do
    local n="${prefix}${i}" v="${prefix}v${i}"
    ip netns add "$n"
    ip link add "$v" type veth peer name eth0 netns "$n"
    ip link set "$v" master "$bridge"
    ip link set "$v" up
    ip netns exec "$n" ip addr add "${subnet}.$((10 + i))/24" dev eth0
    ip netns exec "$n" ip link set eth0 up
    ip netns exec "$n" ip link set lo up
    if [ -n "$rate" ]; then
      shape "$rate" ip netns exec "$n" tc qdisc add dev eth0 # node -> bridge
      shape "$rate" tc qdisc add dev "$v"                      # bridge -> node
    fi
  done
  echo "netns-nodes: ${count} node(s) ${prefix}1..${prefix}${count} on ${subnet}.0/24${rate:+, links shaped to $rate}"
}

check() {
  local probe="${prefix}probe"
  if ! ip netns add "$probe" 2>/tmp/netns-nodes.err; then
    echo "netns-nodes: 'ip netns add' failed: $(cat /tmp/netns-nodes.err)"
    return 1
  fi
  local ok=0 why=""
  if ! ip link add "${prefix}pv" type veth peer name eth0 netns "$probe" 2>/tmp/netns-nodes.err; then
    ok=1 why="'ip link add type veth' failed: $(cat /tmp/netns-nodes.err)"
  elif ! ip netns exec "$probe" unshare --uts sh -c "hostname ${probe}" 2>/tmp/netns-nodes.err; then
    ok=1 why="'unshare --uts' + hostname failed: $(cat /tmp/netns-nodes.err)"
  elif ! ip netns exec "$probe" tc qdisc add dev eth0 root tbf rate 1gbit burst 256kb latency 100ms 2>/tmp/netns-nodes.err; then
    ok=1 why="'tc qdisc add ... tbf' failed: $(cat /tmp/netns-nodes.err)"
  fi
  ip netns del "$probe" 2>/dev/null || true
  ip link del "${prefix}pv" 2>/dev/null || true
  [ $ok -eq 0 ] || echo "netns-nodes: $why"
  return $ok
}

case "${1:-}" in
  up) up "${2:?up N [RATE]}" "${3:-}" ;;
  down) down ;;
  check) check ;;
  agent)
    node=$2
    shift 2
    # A remote shell gets one command line; run it in the node's network namespace and a UTS
    # namespace of its own named after the node (what gethostname and MPI's node detection see).
    exec ip netns exec "$node" unshare --uts /bin/sh -c "hostname $node && exec $*"
    ;;
  probe)
    node=${2:?probe NODE}
    ip netns exec "$node" ping -c 1 -W 1 "${subnet}.1" >/dev/null
    ;;
  mpirun | mpirun-on)
    if [ "$1" = mpirun ]; then
      count=${2:?mpirun N PPN ARGS}
      ppn=${3:?mpirun N PPN ARGS}
      shift 3
      IFS=, read -r -a per <<<"$ppn"
      hosts="" np=0
      for i in $(seq 1 "$count"); do
        k=${per[$(((i - 1) % ${#per[@]}))]}
        hosts="${hosts:+$hosts,}${prefix}${i}:${k}"
        np=$((np + k))
      done
    else
      hosts=${2:?mpirun-on HOSTS ARGS}
      shift 2
      np=0
      IFS=, read -r -a per <<<"$hosts"
      for h in "${per[@]}"; do np=$((np + ${h##*:})); done
    fi
    exec mpirun --allow-run-as-root --oversubscribe --bind-to none --host "$hosts" -np "$np" \
      --mca plm_rsh_agent "$here agent" --mca oob_tcp_if_include "${subnet}.0/24" \
      --mca btl_tcp_if_include "${subnet}.0/24" --mca btl self,vader,tcp "$@"
    ;;
  *)
    sed -n '2,26p' "$0"
    exit 2
    ;;
esac
