#!/usr/bin/env bash
# Checks that the ground floors of src/ include nothing from the capabilities above them:
# src/runtime/ only the runtime (and kernels/), src/memory/ only memory and the runtime. Each
# capability above declares its own backends (its cuda/, host/, mpi/ ... folders), so a new GPU
# path never goes through the runtime. Prints every arrow between capabilities too. CTest runs it
# (label packaging).
#   scripts/check-layers.sh [ROOT]   (default: the repository holding this script)
set -euo pipefail
root="$(cd "${1:-$(dirname "$0")/..}" && pwd -P)"
cd "$root/src"
# Arrows "from -> to" between top-level folders of src/ (quoted "cap/..." and <gpucloud/cap/...>).
arrows=$(grep -rEo '^#include ["<](gpucloud/)?[a-z_]+/' --include='*.cpp' --include='*.hpp' --include='*.cu' \
  --include='*.cuh' . | sed -E 's|^\./([a-z_]+)[^:]*:#include ["<](gpucloud/)?([a-z_]+)/|\1 \3|' |
  while read -r from to; do if [ "$from" != "$to" ] && [ -d "$from" ] && [ -d "$to" ]; then echo "$from $to"; fi; done |
  sort | uniq -c | awk '{ printf "%s -> %s (%d)\n", $2, $3, $1 }')
echo "arrows between capabilities in src/:"
echo "$arrows" | sed 's/^/  /'
bad=0
check() {  # check FLOOR ALLOWED...: FLOOR may include only ALLOWED capabilities (and itself)
  local floor=$1
  shift
  local allowed=" $* detail kernels "
  while read -r from arrow to _; do
    [ "$from" = "$floor" ] || continue
    case "$allowed" in *" $to "*) continue ;; esac
    echo "check-layers: src/$floor includes $to, a capability above it:"
    grep -rnE "^#include [\"<](gpucloud/)?$to/" "$floor" | sed 's/^/  src\//'
    bad=1
  done <<<"$arrows"
}
check runtime
check memory runtime
if [ "$bad" -ne 0 ]; then
  echo "check-layers: the runtime and memory must not know the capabilities above them: declare the"
  echo "  backend in the capability's own folder (e.g. compute/gemm/cuda/gemm_backend.hpp)"
  exit 1
fi
echo "runtime and memory include nothing above them"
