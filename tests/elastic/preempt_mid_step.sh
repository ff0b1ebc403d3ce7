#!/usr/bin/env bash
# The C++ example preempted without --checkpoint-dir: main returns 75 with the step's work still
# queued on its stream (the gradient all-reduce, the optimizer, the stop agreement), and every
# object of main is destroyed while that work runs. It must end cleanly on every rank, each time,
# wherever the notice lands (a buffer freed under the work was a crash in free() on the stream's
# thread).
#
#   tests/elastic/preempt_mid_step.sh TRAIN_MLP [TRIALS]
set -uo pipefail
bin=${1:?usage: preempt_mid_step.sh TRAIN_MLP [TRIALS]}
trials=${2:-6}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1
for t in $(seq 1 "$trials"); do
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$bin" --steps 1000000 --dtype fp32 \
    --log-every 1000000 --metrics-port 0 >"$log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 200); do grep -q '^step     1 ' "$log" && break; sleep 0.05; done
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  kill -USR1 "$launcher"
  code=0
  wait "$launcher" || code=$?
  stopped=$(grep -c '^preempted by .* at step [0-9]*: no --checkpoint-dir' "$log")
  if [ "$code" -ne 75 ] || [ "$stopped" -ne 1 ] || grep -qE 'Segmentation|double free|corrupted|Aborted|signal 11' "$log"; then
    cut -c1-200 "$log" | tail -40
    echo "PREEMPT MID-STEP TEST FAILED: trial $t: exit $code, $stopped stop line(s)"
    exit 1
  fi
done
echo "$trials preemptions mid-step: every rank exited 75 cleanly"
echo "PREEMPT MID-STEP TEST PASSED"
