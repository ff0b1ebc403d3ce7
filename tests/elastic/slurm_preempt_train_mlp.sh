#!/usr/bin/env bash
# deploy/slurm/train_mlp_cpu.sbatch preempted on the test Slurm cluster (slurm_cluster fixture), as
# shipped (2 nodes of 2 tasks, or its 4 tasks on the one node): twice, each time while it trains:
#   1. scancel --signal=USR1 --batch: the notice --signal=B:USR1@120 gives before the time limit;
#   2. scontrol requeue: Slurm itself ends the job (SIGTERM to every task, KillWait later SIGKILL)
#      and queues it again.
# Each time the ranks must agree on a step, commit its checkpoint and exit 75; the job must come
# back by itself (the script's scontrol requeue, or Slurm's), resume at exactly that step (0 steps
# lost) and finish.
#
#   tests/elastic/slurm_preempt_train_mlp.sh TRAINER WORKDIR NODES
set -euo pipefail
trainer=$1 work=$2 nodes=${3:-2}
root="$(cd "$(dirname "$0")/../.." && pwd)"
slurm="$root/scripts/slurm-cluster.sh"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() {
  echo "SLURM PREEMPT TEST FAILED: $1"
  for f in "$work"/*.log; do
    echo "--- $f"
    cat "$f"
  done
  "$slurm" run scontrol show job "${job:-0}" 2>/dev/null | head -30 || true
  [ -z "${job:-}" ] || "$slurm" run scancel "$job" 2>/dev/null || true
  exit 1
}
state() { "$slurm" run scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1; }
wait_for() { # wait_for SECONDS WHAT CMD...: until CMD succeeds
  local seconds=$1 what=$2
  shift 2
  local end=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < end)) || fail "waited ${seconds} s for $what"
    sleep 0.2
  done
}
in_log() { grep -Eq "$2" "$1" 2>/dev/null; }
done_training() { [ "$(state)" = COMPLETED ] && in_log "$1" "^final: loss"; }

round() { # round NAME HOW: submit, preempt HOW while it trains, expect the requeued job to resume
  local name=$1 how=$2 log="$work/$1.log"
  local layout=()
  [ "$nodes" -eq 2 ] || layout=(-N "$nodes" --ntasks-per-node $((4 / nodes)))
  job=$("$slurm" run env TRAINER="$trainer" CHECKPOINT_DIR="$work/$name-checkpoints" \
    sbatch --parsable "${layout[@]}" -o "$log" "$root/deploy/slurm/train_mlp_cpu.sbatch" \
    --steps 3000 --log-every 1000 --checkpoint-every 500)
  job=${job%%;*}
  echo "$name: job $job"
  wait_for 120 "the job to train" in_log "$log" "checkpoint: step 500"
  case "$how" in
    notice) "$slurm" run scancel --signal=USR1 --batch "$job" ;;
    requeue) "$slurm" run scontrol requeue "$job" ;;
  esac
  wait_for 120 "the ranks to save and stop" in_log "$log" "exit 75 to be requeued"
  local stopped
  stopped=$(sed -n 's/^preempted by .* at step \([0-9]*\): checkpoint at step [0-9]* committed.*/\1/p' "$log" | sort -u)
  [ -n "$stopped" ] || fail "$name: no rank reported its preemption checkpoint"
  [ "$(echo "$stopped" | wc -l)" -eq 1 ] || fail "$name: the ranks stopped at different steps: $stopped"
  [ -f "$work/$name-checkpoints/step-$(printf %012d "$stopped")/manifest.json" ] ||
    fail "$name: no committed checkpoint at the stop step $stopped"
  # Slurm holds a requeued job back for AuthInfo's cred_expire + 1 s (its begin time; 21 s on the
  # test cluster, 121 s by default), while its nodes end the last run's step: started earlier, the
  # new step's launch fails.
  wait_for 360 "the requeued job to finish" done_training "$log"
  in_log "$log" "resumed from .*step-0*$stopped at step $stopped \(written by 4 rank\(s\)\)" ||
    fail "$name: the requeued job did not resume at the stop step $stopped (steps lost)"
  in_log "$log" "checkpoint: step 3000" || fail "$name: the requeued job did not finish its checkpoints"
  echo "$name: preempted at step $stopped, requeued, resumed at step $stopped, finished"
}

round notice notice
grep -q "requeueing job" "$work/notice.log" || fail "notice: the job script did not requeue itself"
round requeue requeue
echo "SLURM PREEMPT TEST PASSED"
