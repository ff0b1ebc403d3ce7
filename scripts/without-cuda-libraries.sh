#!/usr/bin/env bash
# Runs a command as on a machine without any CUDA library: in a private mount namespace, an empty
# read-only tmpfs over each /usr/local/cuda* directory (the toolkit: cuBLASLt, cuDNN and NCCL
# live there here, and ld.so.conf points there). The command sees the same files otherwise, and
# the mounts vanish with it. GPUCLOUD_HIDE_COMPILER=1 hides the compilers' back ends as well
# (/usr/lib/gcc, /usr/libexec/gcc: g++ then compiles nothing), as on a user's machine without one.
# Needs root (CI runs as root), or unprivileged user namespaces.
#   scripts/without-cuda-libraries.sh COMMAND [ARGS...]
set -euo pipefail
if [ "${GPUCLOUD_CUDA_HIDDEN:-}" != 1 ]; then
  flags=(--mount --propagation private)
  [ "$(id -u)" = 0 ] || flags+=(--map-root-user)
  exec unshare "${flags[@]}" env GPUCLOUD_CUDA_HIDDEN=1 "$0" "$@"
fi
hide=(/usr/local/cuda*)
[ "${GPUCLOUD_HIDE_COMPILER:-}" = 1 ] && hide+=(/usr/lib/gcc /usr/libexec/gcc)
for dir in "${hide[@]}"; do
  if [ -d "$dir" ] && [ ! -L "$dir" ]; then
    mount -t tmpfs -o ro,size=4k gpucloud-without-cuda "$dir"
  fi
done
exec "$@"
