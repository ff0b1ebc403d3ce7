#!/usr/bin/env bash
# scripts/gpu-check.sh's control flow, on a machine without a GPU (the GPU steps never start):
#  1. a budget cut mid-step: the step is stopped and listed as CUT, the later steps are not run,
#     and what the run has so far (summary, failures, environment, the logs' tarball) is in $OUT;
#  2. a failing step: listed as FAIL with its first error line, its log's first and last lines in
#     failures.log, and the script's status is non-zero.
# Builds go to a temporary directory (GPUCHECK_BUILD_DIR), never into the source tree.
#   tests/gpu_check_flow.sh SOURCE_DIR
set -euo pipefail
src="$(cd "$1" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "gpu-check flow: $*"
  exit 1
}

# 1. A two-second budget: configure (CMake with CUDA takes longer) is cut, nothing after it runs.
mkdir -p "$work/out1"
rc=0
OUT="$work/out1" GPUCHECK_BUILD_DIR="$work/b1" GPUCHECK_BUDGET=2 GPUCHECK_ARCHS=80 \
  bash "$src/scripts/gpu-check.sh" >"$work/run1.log" 2>&1 || rc=$?
[ "$rc" = 0 ] || fail "a cut run should end with status 0 (nothing failed), got $rc: $(tail -n 5 "$work/run1.log")"
for f in summary.md failures.log environment.log gpu-check-logs.tar.gz; do
  [ -s "$work/out1/$f" ] || [ "$f" = failures.log ] || fail "\$OUT/$f is missing or empty after a cut run"
done
grep -q '^| environment ' "$work/out1/summary.md" || fail "no environment row: $(cat "$work/out1/summary.md")"
grep -Eq '^\| [a-z ]+\| (CUT|skip) ' "$work/out1/summary.md" ||
  fail "no step was cut or skipped at the budget: $(cat "$work/out1/summary.md")"
if grep -Ev '^\| (environment|python module) ' "$work/out1/summary.md" | grep -E '\| (ok|FAIL) ' >/dev/null; then
  fail "a step ran to its end after the budget was spent: $(cat "$work/out1/summary.md")"
fi
# Listed to a file first: `tar | grep -q` under pipefail fails whenever grep's early exit gives tar
# a SIGPIPE (it did on a CI machine).
tar -tzf "$work/out1/gpu-check-logs.tar.gz" >"$work/listing" || fail "the tarball does not read back"
grep -q 'gpu-check/summary.md' "$work/listing" || fail "the tarball lacks the summary: $(cat "$work/listing")"
[ ! -e "$src/build/gpu-check/summary.md" ] || [ "$src/build/gpu-check/summary.md" -ot "$work/run1.log" ] ||
  fail "the run wrote into the source tree's build/"

# 2. A step that fails (CMake refuses the CUDA architecture): FAIL, its first error line, and the
#    log's lines in failures.log; the status says so.
mkdir -p "$work/out2"
rc=0
OUT="$work/out2" GPUCHECK_BUILD_DIR="$work/b2" GPUCHECK_BUDGET=300 GPUCHECK_ARCHS=no_such_arch \
  bash "$src/scripts/gpu-check.sh" >"$work/run2.log" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "a failed step must make the status non-zero: $(tail -n 5 "$work/run2.log")"
grep -Eq '^\| configure +\| FAIL ' "$work/out2/summary.md" || fail "configure not FAIL: $(cat "$work/out2/summary.md")"
grep -q '^== configure (rc ' "$work/out2/failures.log" || fail "failures.log lacks the step: $(cat "$work/out2/failures.log")"
grep -q -- '-- last lines:' "$work/out2/failures.log" || fail "failures.log lacks the log's last lines"
echo "gpu-check flow: cut and failed steps reported, results in \$OUT"
