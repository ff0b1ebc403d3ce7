#!/usr/bin/env bash
# Two test Slurm clusters side by side (scripts/slurm-cluster.sh): with the slurm_cluster fixture's
# cluster up, a second one started under other names, subnet, port and state directory runs a job
# on its own node while the first still runs one on its; stopping the second leaves the first up.
#   tests/comm/slurm_two_clusters.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cluster="$root/scripts/slurm-cluster.sh"
second=(env GPUCLOUD_SLURM_DIR=/tmp/gpucloud-slurm-second GPUCLOUD_SLURM_PREFIX=gcsm GPUCLOUD_SLURM_SUBNET=10.79.0
  GPUCLOUD_SLURM_PORT=16917)
fail() {
  echo "TWO CLUSTERS FAILED: $*"
  exit 1
}
trap '"${second[@]}" "$cluster" down >/dev/null 2>&1 || true' EXIT
"${second[@]}" "$cluster" up 1 2 || fail "the second cluster did not start"
first_node=$("$cluster" run srun -N 1 -n 1 hostname) || fail "the first cluster runs no job"
second_node=$("${second[@]}" "$cluster" run srun -N 1 -n 1 hostname) || fail "the second cluster runs no job"
echo "first cluster ran on $first_node, the second on $second_node"
[ "$first_node" != "$second_node" ] || fail "both jobs ran on $first_node"
case "$second_node" in gcsm* | "$(hostname)") ;; *) fail "the second cluster's job ran on $second_node" ;; esac
"${second[@]}" "$cluster" down
"$cluster" run srun -N 1 -n 1 true || fail "the first cluster stopped with the second"
echo "TWO CLUSTERS PASSED"
