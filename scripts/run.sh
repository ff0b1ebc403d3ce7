#!/usr/bin/env bash
# Sets up, builds and runs the main job: data-parallel mixed-precision training of an MLP
# (examples/train_mlp.cpp). On the host backend: two MPI ranks when mpirun is there, else one
# process. With GPUs: one rank per visible GPU over NCCL when there are several and mpirun is
# there, else one process on the GPU. Extra arguments go to train_mlp, e.g. --steps 6000 --dtype bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p build
cfg=(-DCMAKE_BUILD_TYPE=Release -DGPUCLOUD_BUILD_TESTS=OFF)
device=host
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  cfg+=(-DGPUCLOUD_CUDA_ARCHS=native)  # build for the GPU that is here
  device=cuda
fi
cmake -S . -B build/run "${cfg[@]}" >build/run.configure.log 2>&1 || { cat build/run.configure.log; exit 1; }
cmake --build build/run -j "${GPUCLOUD_JOBS:-2}" --target train_mlp devices_demo
build/run/examples/devices_demo | head -n 3
echo
ranks=2
[ "$device" = cuda ] && ranks=$(nvidia-smi -L | wc -l)
if command -v mpirun >/dev/null 2>&1 && [ "$ranks" -ge 2 ]; then
  OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mpi_yield_when_idle=1 \
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" build/run/examples/train_mlp \
    --device "$device" "$@"
else
  build/run/examples/train_mlp --device "$device" "$@"
fi
