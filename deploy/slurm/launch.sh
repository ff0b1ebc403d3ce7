#!/bin/bash
# What gpucloud's Slurm job scripts run inside their allocation (deploy/slurm/*.sbatch): NCCL's and
# gpucloud's settings, the device, the checkpoint directory, the metrics, then one task per slot
# with srun through PMIx (OpenMPI's ranks need no mpirun). Run it yourself inside an allocation
# (salloc) as well:
#
#   deploy/slurm/launch.sh PROGRAM [WORDS...] -- [trainer options...]
#   deploy/slurm/launch.sh build/main/examples/train_mlp -- --steps 20000
#   deploy/slurm/launch.sh python3 examples/train_mlp.py -- --steps 20000
#
# The trainer gets --device, --checkpoint-dir, --resume (and --metrics-port) before the options.
# The environment picks the rest:
#   CHECKPOINT_DIR  a directory every node sees (default: checkpoints/<job name> under the submit
#                   directory: a resubmitted job of the same name resumes)
#   DEVICE          cuda (default on nodes with GPUs) or host
#   METRICS_PORT    serve Prometheus metrics: each task on METRICS_PORT + its local rank
#   PROMETHEUS_TARGETS_DIR  with METRICS_PORT: each task writes its scrape target there
#                   (<job>-<task>.json, Prometheus's file_sd format; deploy/prometheus/prometheus.yml
#                   reads such a directory) while it runs, and removes it when it ends
#   PROMETHEUS_TARGET_HOST  how Prometheus reaches a node: hostname (default) or address (its
#                   first IP address, where node names do not resolve)
#   MAX_RESTARTS    restarts of the step after a failure (a rank died, a collective timed out),
#                   each from the newest valid checkpoint, by gpucloud-run (default 3; 0: none)
#                   (its heartbeats and status.json: gpucloud-run/<job id> in the submit directory)
#   GPUCLOUD_RUN    the gpucloud-run command (default: gpucloud-run on the PATH, else the
#                   python/gpucloud/run.py of this source tree, run by python3)
#
# Preemption (docs/fault-tolerance.md): SIGUSR1 or SIGTERM to this script (the job scripts'
# --signal=B:USR1@120, scancel --signal=USR1 --batch, a requeue by Slurm) is passed on to the
# ranks, which save at their current step and exit 75; the job is then requeued
# (scontrol requeue: the job scripts say --requeue) and resumes at that step. A job scancel ends
# (Slurm already marks it COMPLETING when the SIGTERM arrives) saves the same way and is not requeued.
set -euo pipefail
program=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  program+=("$1")
  shift
done
[ $# -gt 0 ] && shift # the --
[ ${#program[@]} -gt 0 ] || { echo "launch.sh: no program (launch.sh PROGRAM [WORDS...] -- [options...])" >&2; exit 2; }

# NCCL (the GPU collectives; the host backend ignores these):
# - NCCL_SOCKET_IFNAME: the interface NCCL's bootstrap and socket transport use between nodes.
#   On nodes with several interfaces (docker0, a management network) NCCL may pick one the
#   other nodes cannot reach and hang at init: name the cluster network ("ib0", "eth0") or
#   exclude the others ("^lo,docker").
# - NCCL_IB_DISABLE: 1 where there is no InfiniBand/RoCE (most cloud VMs without EFA), so NCCL
#   uses TCP sockets instead of probing for verbs; 0 (the default) where the fabric exists.
# - NCCL_DEBUG: WARN prints only problems; INFO prints the chosen interfaces, transports and
#   rings at init (use it once per new cluster; NCCL_DEBUG_SUBSYS=INIT,NET narrows it).
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^lo,docker}"
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# gpucloud: a collective that does not finish within this many seconds raises
# CommunicationError on every rank that waits (a dead node), and the job ends instead of hanging
# until the time limit.
export GPUCLOUD_COMM_TIMEOUT="${GPUCLOUD_COMM_TIMEOUT:-600}"

# Threads per rank: the cores Slurm gave each task (OpenBLAS and the host loops use them).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"

cd "${SLURM_SUBMIT_DIR:-.}"
checkpoints="${CHECKPOINT_DIR:-checkpoints/${SLURM_JOB_NAME:-train_mlp}}"
device="${DEVICE:-}"
if [ -z "$device" ]; then
  device=host
  if [ -n "${SLURM_GPUS_ON_NODE:-}${CUDA_VISIBLE_DEVICES:-}" ]; then device=cuda; fi
fi
mkdir -p "$checkpoints"
echo "job ${SLURM_JOB_ID:-?}: ${SLURM_NTASKS:-1} task(s) on ${SLURM_JOB_NUM_NODES:-1} node(s) (${SLURM_JOB_NODELIST:-}), tasks per node ${SLURM_TASKS_PER_NODE:-?}, device $device, checkpoints in $checkpoints"

# Metrics: every task serves /metrics; with a targets directory each task also registers itself
# with Prometheus for as long as it runs (the node and port are only known on the node).
metrics=()
wrap=()
if [ -n "${METRICS_PORT:-}" ]; then
  metrics=(--metrics-port "$METRICS_PORT")
  if [ -n "${PROMETHEUS_TARGETS_DIR:-}" ]; then
    mkdir -p "$PROMETHEUS_TARGETS_DIR"
    export PROMETHEUS_TARGETS_DIR METRICS_PORT
    wrap=(bash -c '
      case "${PROMETHEUS_TARGET_HOST:-hostname}" in
        address) host=$(hostname -I | awk "{print \$1}") ;;
        *) host=$(hostname) ;;
      esac
      target="$PROMETHEUS_TARGETS_DIR/$SLURM_JOB_ID-$SLURM_PROCID.json"
      printf "[{\"targets\": [\"%s:%d\"], \"labels\": {\"gpucloud\": \"true\"}}]\n" \
        "$host" $((METRICS_PORT + SLURM_LOCALID)) >"$target.tmp"
      mv "$target.tmp" "$target" # whole, for Prometheus file watcher
      "$@" &
      child=$!
      trap "kill -TERM $child 2>/dev/null" TERM INT
      trap "kill -USR1 $child 2>/dev/null" USR1
      rc=0
      wait $child || rc=$?
      if kill -0 $child 2>/dev/null; then wait $child || rc=$?; fi # after a forwarded signal
      rm -f "$target"
      exit $rc' task)
  fi
fi

# The supervisor: gpucloud-run restarts a failed step from the newest valid checkpoint.
supervisor=()
if [ "${MAX_RESTARTS:-3}" != 0 ]; then
  if [ -n "${GPUCLOUD_RUN:-}" ]; then
    read -r -a supervisor <<<"$GPUCLOUD_RUN"
  elif command -v gpucloud-run >/dev/null 2>&1; then
    supervisor=(gpucloud-run)
  else
    supervisor=(python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/python/gpucloud/run.py")
  fi
  supervisor+=(--max-restarts "${MAX_RESTARTS:-3}" --require-heartbeat --run-dir "gpucloud-run/${SLURM_JOB_ID:-local}"
    --job-name "${SLURM_JOB_NAME:-train}" --)
fi

# One task per GPU; srun's PMIx plugin wires OpenMPI's ranks up (--mpi=pmix), gpucloud reads the
# nodes from the step's variables and the shared-memory split. --kill-on-bad-exit: one failed
# rank ends the step instead of leaving the others waiting for it. In the background, so that
# this shell passes a preemption notice on at once (bash runs a trap only between commands).
"${supervisor[@]}" srun --mpi=pmix --kill-on-bad-exit=1 "${wrap[@]}" "${program[@]}" --device "$device" \
  --checkpoint-dir "$checkpoints" --resume "${metrics[@]}" "$@" &
job=$!
cancelled=""
notice() {
  echo "launch.sh: preemption notice ($1): passing it on, the ranks save at their current step"
  kill -USR1 "$job" 2>/dev/null || true
  # scancel sends SIGTERM too, to a job Slurm already marks as ending: that one is not requeued.
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    local state
    state=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2) || true
    case "$state" in COMPLETING | CANCELLED) cancelled=$state ;; esac
  fi
}
trap 'notice USR1' USR1
trap 'notice TERM' TERM
rc=0
wait "$job" || rc=$?
while kill -0 "$job" 2>/dev/null; do # a trap ended the wait: wait for the job itself
  rc=0
  wait "$job" || rc=$?
done
if [ "$rc" -eq 75 ] && [ -n "$cancelled" ]; then
  echo "launch.sh: the job was cancelled (scancel; Slurm says $cancelled): its checkpoint is saved, it is not requeued (resubmit it to resume)"
elif [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
  echo "launch.sh: the job stopped for a preemption with its checkpoint saved: requeueing job $SLURM_JOB_ID"
  if ! out=$(scontrol requeue "$SLURM_JOB_ID" 2>&1); then
    case "$out" in
      *pending*) echo "launch.sh: Slurm is requeueing the job itself" ;;
      *) echo "launch.sh: scontrol requeue failed ($out): resubmit the job to resume" ;;
    esac
  fi
fi
exit "$rc"
