#!/usr/bin/env bash
# Installs what gpucloud needs to build and test on Debian 12 (idempotent; apt only when missing).
# Python packages (pybind11, scikit-build-core, numpy, pytest) come from PyPI when the package is
# built and tested (scripts/test.sh does that in a virtual environment). PyTorch (CPU build) and
# mpi4py come from Debian, for the interop tests, which run with Debian's own Python.
# civetweb (under prometheus-cpp) loads libssl.so/libcrypto.so by those names for the endpoint's TLS:
# libssl-dev provides them; openssl makes the test certificates.
# Slurm (slurmctld, slurmd, srun with its PMIx plugin) and munge run the one-machine Slurm cluster
# of the Slurm tests (scripts/slurm-cluster.sh). iputils-ping: the network-namespace nodes' probe.
# gdb: the fault tests print every thread's stack of a job that does not end.
# The CUDA toolkit is not installed here: it is found at /usr/local/cuda when present, and the
# host-only library builds without it.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libbenchmark-dev clang-format python3 python3-pip python3-venv python3-dev libopenmpi-dev openmpi-bin libdlpack-dev libopenblas-dev libhwloc-dev pkg-config doxygen
  libdnnl-dev ocl-icd-opencl-dev
  nlohmann-json3-dev libxxhash-dev prometheus-cpp-dev prometheus libssl-dev openssl
  python3-torch python3-mpi4py iproute2 iputils-ping gdb slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit $(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') found"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda: building the host backend only"
fi
