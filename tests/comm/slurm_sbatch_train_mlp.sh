#!/usr/bin/env bash
# deploy/slurm/train_mlp_cpu.sbatch as users submit it, on the test Slurm cluster (slurm_cluster
# fixture): as shipped (2 nodes of 2 tasks) where the cluster has 2 nodes, else its 4 tasks on the
# one node; 300 steps with a checkpoint every 100; the log must show
# 4 ranks on the nodes Slurm gave and the run's end, and the checkpoint directory step 300. The
# same job resubmitted for 400 steps must resume from step 300 (what a requeued job does).
#
#   tests/comm/slurm_sbatch_train_mlp.sh TRAINER WORKDIR NODES
set -euo pipefail
trainer=$1 work=$2 nodes=${3:-2}
root="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
submit() { # submit LOG ARGS...: sbatch --wait, the log printed whatever happens
  local log=$1
  shift
  local rc=0
  local layout=() # the #SBATCH lines' 2 x 2, or 4 tasks on one node
  [ "$nodes" -eq 2 ] || layout=(-N "$nodes" --ntasks-per-node $((4 / nodes)))
  "$root/scripts/slurm-cluster.sh" run env TRAINER="$trainer" CHECKPOINT_DIR="$work/checkpoints" \
    sbatch --wait "${layout[@]}" -o "$log" \
    "$root/deploy/slurm/train_mlp_cpu.sbatch" --log-every 100 --checkpoint-every 100 "$@" || rc=$?
  echo "--- $log (sbatch exit $rc)"
  cat "$log"
  [ "$rc" -eq 0 ] || { echo "SBATCH TEST FAILED: the job failed"; exit 1; }
}
need() { # need LOG REGEX WHAT
  grep -Eq "$2" "$1" || { echo "SBATCH TEST FAILED: $3 (no /$2/ in $1)"; exit 1; }
}

submit first.log --steps 300
need first.log "^job [0-9]+: 4 task\(s\) on $nodes node\(s\)" "the job's allocation"
need first.log "train_mlp: 4 rank\(s\)" "4 ranks"
if [ "$nodes" -gt 1 ]; then
  need first.log "hierarchical all-reduce: yes \($nodes node\(s\) of $((4 / nodes))\)" "the nodes found"
fi
need first.log "^final: loss" "the end of training"
[ -f checkpoints/step-000000000300/manifest.json ] || { echo "SBATCH TEST FAILED: no committed checkpoint at step 300"; ls -R checkpoints; exit 1; }

submit second.log --steps 400
need second.log "resumed from .*step-000000000300 at step 300 \(written by 4 rank\(s\)\)" "the resumed run"
need second.log "checkpoint: step 400" "the resumed run's checkpoint"
need second.log "^final: loss" "the end of the resumed run"
echo "SBATCH TEST PASSED"
