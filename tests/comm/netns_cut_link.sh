#!/usr/bin/env bash
# A node cut off mid all-reduce (#18): 2 network-namespace nodes x 2 ranks all-reduce 1 and 4 MiB in a
# loop; once every rank has done a few rounds, node 2's link goes down. Passes when, within the
# timeout plus a few seconds, both ranks of node 1 report a CommunicationError naming the
# all-reduce, and no rank process is left on either node (node 2's ranks time out too, but their
# output travelled over the cut link). mpirun itself, whose control channel to node 2 is that link,
# waits for node 2's daemon: the script ends both, and restores the link.
#
#   tests/comm/netns_cut_link.sh TEST_COMM_TIMEOUT_BINARY      (needs the netns_nodes fixture: 2 nodes)
set -uo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
bin=${1:?usage: netns_cut_link.sh test_comm_timeout}
log=$(mktemp)
export GPUCLOUD_COMM_TIMEOUT=3 OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1
"$here/scripts/netns-nodes.sh" mpirun 2 2 "$bin" cut >"$log" 2>&1 &
launcher=$!
restore() {
  ip link set gcnodev2 up 2>/dev/null || true
  kill "$launcher" 2>/dev/null || true
  for n in gcnode1 gcnode2; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  rm -f "$log"
}
trap restore EXIT
for _ in $(seq 1 120); do
  [ "$(grep -c 'ready' "$log")" -ge 4 ] && break
  sleep 0.25
done
if [ "$(grep -c 'ready' "$log")" -lt 4 ]; then
  cat "$log"
  echo "CUT LINK TEST FAILED: the ranks never got going"
  exit 1
fi
ip link set gcnodev2 down
cut_at=$(date +%s)
left=1
for _ in $(seq 1 60); do
  sleep 0.25
  left=0
  for n in gcnode1 gcnode2; do
    for p in $(ip netns pids "$n" 2>/dev/null); do
      grep -q "$(basename "$bin")" "/proc/$p/cmdline" 2>/dev/null && left=$((left + 1))
    done
  done
  [ "$left" -eq 0 ] && break
done
took=$(($(date +%s) - cut_at))
grep -v '^\s*$' "$log" | cut -c1-200
errors=$(grep -c 'cut: rank [01] CommunicationError at .*Communicator::all_reduce: gcnode1:rank [01] waited' "$log")
echo "after the cut: $errors CommunicationError(s) on node 1, $left rank process(es) left after ${took} s"
if [ "$errors" -eq 2 ] && [ "$left" -eq 0 ] && [ "$took" -le 12 ]; then
  echo "CUT LINK TEST PASSED"
else
  echo "CUT LINK TEST FAILED"
  exit 1
fi
