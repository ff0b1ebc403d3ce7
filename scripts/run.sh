#!/usr/bin/env bash
# Sets up, builds and runs the main job. Until the training example lands this is the devices
# demo: it lists the devices and exercises streams, events and memory on each of them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
archs_args=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  archs_args=(-DGPUCLOUD_CUDA_ARCHS=native)  # build for the GPU that is here
fi
mkdir -p build
cmake -S . -B build/run -DCMAKE_BUILD_TYPE=Release -DGPUCLOUD_BUILD_TESTS=OFF "${archs_args[@]}" >build/run.configure.log 2>&1 ||
  { cat build/run.configure.log; exit 1; }
cmake --build build/run -j "${GPUCLOUD_JOBS:-2}" --target devices_demo
build/run/examples/devices_demo
