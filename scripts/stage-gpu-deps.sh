#!/usr/bin/env bash
# Stages into .deps/ (git-ignored) what the GPU machine's image lacks, for the device tool to carry
# (`carry: [".deps"]`); run it on a Debian machine with scripts/setup.sh's packages, before the
# device call: GoogleTest's sources; Google Benchmark's headers, shared library and CMake package
# (a relocatable prefix); DLPack's header (the Python bindings). scripts/gpu-check.sh picks them
# up. The image has CUDA,
# cuDNN and NCCL (the latter two as PyTorch's nvidia wheels, which CMake finds), CMake and ninja;
# it has no OpenBLAS (the host GEMM then uses its built-in loops) and no MPI (the mpirun tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps
mkdir -p .deps
cp -r /usr/src/googletest .deps/googletest
multiarch=lib/x86_64-linux-gnu
prefix=.deps/benchmark
mkdir -p "$prefix/include" "$prefix/$multiarch/cmake"
cp -r /usr/include/benchmark "$prefix/include/"
cp -a /usr/$multiarch/libbenchmark.so* /usr/$multiarch/libbenchmark_main.a "$prefix/$multiarch/"
cp -r /usr/$multiarch/cmake/benchmark "$prefix/$multiarch/cmake/"
mkdir -p .deps/include  # header-only: nlohmann-json and xxHash (checkpoints)
cp -r /usr/include/nlohmann .deps/include/
cp /usr/include/xxhash.h .deps/include/
mkdir -p .deps/dlpack/include
cp -r /usr/include/dlpack .deps/dlpack/include/
du -sh .deps
