#!/usr/bin/env bash
# On a machine with a GPU, within one short window (the device tool lends ~15 minutes in all, at
# most 10 a command): what only a GPU can tell, most important first, each step's result kept the
# moment it ends. No host suite runs here: the CPU machines run it.
#
#   1. the environment: nvidia-smi -q, MIG mode, torch's current stream handle
#   2. configure (the cuDNN/NCCL/cuBLAS CMake picked) and build (the first error lines on failure),
#      ldd of the library
#   3. the GPU's own C++ cases (ctest -R on the CUDA cases) with cuBLASLt, cuDNN and NCCL logging on
#   4. the Python package's CUDA cases and the torch drop-ins on CUDA tensors (test_torch_cuda.py)
#   5. short training runs on the GPU, restarts, device monitoring, the topology (NVML's links)
#   6. probes under compute-sanitizer memcheck: a GEMM bias at every offset, the stream adoption
#   7. trimmed sanitizer runs (memcheck, racecheck) over the CUDA cases
#   8. benchmarks, last
#
# Budget: GPUCHECK_BUDGET seconds (default 420, so that a second short call on the warm machine
# can rerun what failed); a step that would start later is skipped, one still running then is
# stopped and listed as CUT. GPUCHECK_ONLY (a regular expression over step names) runs only the
# matching steps after the build, for that second call. GPUCHECK_ARCHS (default native) sets the
# CUDA architectures.
#
# Results: build/gpu-check (or $GPUCHECK_BUILD_DIR/gpu-check; one log per step); where $OUT is
# set (the device tool), after every step: summary.md (a row per step), failures.log (the first lines of each failed step's log),
# environment.log and gpu-check-logs.tar.gz (every log so far): four files, within the tool's
# eight. A run cut short by the tool still returns everything up to its last finished step.
#
# On the device machine (its image has CUDA, cuDNN and NCCL wheels, CMake, ninja, PyTorch; no
# GoogleTest, Google Benchmark, OpenBLAS, MPI or DLPack headers): run scripts/stage-gpu-deps.sh
# here first, then the device call with carry [".deps"] and `bash scripts/gpu-check.sh`.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
base="${GPUCHECK_BUILD_DIR:-build}"  # where the build and the logs go
out="$base/gpu-check"
budget="${GPUCHECK_BUDGET:-420}"
only="${GPUCHECK_ONLY:-}"
rm -rf "$out"
mkdir -p "$out"
: >"$out/summary.md"
: >"$out/failures.log"
summary=()

# Copies what this run has so far to $OUT: called after every step.
publish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$out/summary.md" "$out/failures.log" "$OUT"/ 2>/dev/null
  [ -f "$out/environment.log" ] && cp "$out/environment.log" "$OUT"/ 2>/dev/null
  tar -czf "$OUT/gpu-check-logs.tar.gz.part" -C "$base" gpu-check 2>/dev/null &&
    mv "$OUT/gpu-check-logs.tar.gz.part" "$OUT/gpu-check-logs.tar.gz"
}
record() {  # record NAME RESULT SECONDS DETAIL
  local row
  row="$(printf '| %-34s | %-6s | %6ss | %s |' "$1" "$2" "$3" "$4")"
  summary+=("$row")
  echo "$row" | tee -a "$out/summary.md"
  publish
}
# The first lines that say what went wrong: compiler errors, CUDA/cuBLAS/cuDNN/NCCL errors, gtest
# failures, Python tracebacks' last lines.
first_errors() {
  grep -m 8 -E "error|Error|FAILED|Failed|CUDA_ERROR|CUBLAS_STATUS|CUDNN_STATUS|NCCL WARN|Traceback|E  " "$1" |
    cut -c1-200
}
run_step() {  # run_step NAME LOG CMD...
  local name=$1 log=$2 t0=$SECONDS
  shift 2
  if [ -n "$only" ] && [ "${gate_only:-0}" = 1 ] && ! [[ "$name" =~ $only ]]; then return 0; fi
  if [ "$SECONDS" -ge "$budget" ]; then record "$name" skip 0 "over the ${budget}s budget"; return 1; fi
  # No step runs past the budget: one that would is stopped there (rc 124) and reported as cut.
  local rc=0
  timeout $((budget - SECONDS)) "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then record "$name" ok $((SECONDS - t0)) "$(tail -n 1 "$log" | cut -c1-70)"; return 0; fi
  {
    echo "== $name (rc $rc, $log)"
    first_errors "$log"
    echo "-- last lines:"
    tail -n 15 "$log"
  } >>"$out/failures.log"
  if [ "$rc" = 124 ]; then
    record "$name" CUT $((SECONDS - t0)) "stopped at the ${budget}s budget; $(tail -n 1 "$log" | cut -c1-50)"
    return 1
  fi
  record "$name" FAIL $((SECONDS - t0)) "$(first_errors "$log" | head -n 1 | cut -c1-90)"
  return 1
}

# 1. What the machine has, first: a new image's first run learns it from here.
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
{
  echo "GPU: ${gpu:-none found}"
  echo "MIG mode: $(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader 2>/dev/null | head -n 1)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1)"
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'available',
    torch.cuda.is_available()); print('torch current stream handle:',
    torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() else None)" 2>&1 | tail -n 2
  python3 -c "import nvidia; print('nvidia wheels:', list(nvidia.__path__))" 2>/dev/null
  for f in /usr/local/cuda/lib64/lib{cublas,cublasLt,cudnn,nccl}.so*; do [ -e "$f" ] && printf '%s ' "${f##*/}"; done
  echo
} >"$out/environment.log" 2>&1
cat "$out/environment.log"
nvidia-smi -q >"$out/nvidia-smi-q.log" 2>&1
record environment "$([ -n "$gpu" ] && echo ok || echo note)" "$SECONDS" "${gpu:-no GPU (nvidia-smi found none)}"

# 2. Configure and build for this GPU.
cfg=(-DCMAKE_BUILD_TYPE=Release -DGPUCLOUD_CUDA=ON -DGPUCLOUD_CUDA_ARCHS="${GPUCHECK_ARCHS:-native}")
# The Python module needs Python's headers, pybind11 and DLPack's header; without them the C++
# checks still run.
python_module=0
if { [ -d .deps/dlpack ] || [ -f /usr/include/dlpack/dlpack.h ]; } && python3 -c "import os, sysconfig, pybind11; assert os.path.exists(sysconfig.get_paths()['include'] + '/Python.h')" \
  2>/dev/null; then
  cfg+=(-DGPUCLOUD_BUILD_PYTHON=ON -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
  python_module=1
fi
[ -d .deps/googletest ] && cfg+=(-DGPUCLOUD_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
[ -d .deps/benchmark ] && cfg+=(-DCMAKE_PREFIX_PATH="$PWD/.deps/benchmark")
[ -d .deps/dlpack ] && cfg+=(-DGPUCLOUD_DLPACK_INCLUDE="$PWD/.deps/dlpack/include")
if [ -d .deps/benchmark ] || [ -f /usr/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkConfig.cmake ]; then
  cfg+=(-DGPUCLOUD_BUILD_BENCH=ON)
fi
command -v ninja >/dev/null && cfg+=(-G Ninja)
rm -rf "$base/gpu"
built=0
if run_step configure "$out/configure.log" cmake -S . -B "$base/gpu" "${cfg[@]}"; then
  { echo "--- what CMake found"; grep -E '^-- (gpucloud|Found)' "$out/configure.log"; } >>"$out/environment.log"
  if run_step build "$out/build.log" cmake --build "$base/gpu" -j "$(nproc)"; then
    built=1
    lib=$(find "$base/gpu/src" -name 'libgpucloud.so*' -type f | head -n 1)
    { echo "--- ldd $lib"; ldd "$lib" 2>&1 | grep -E "cuda|cublas|cudnn|nccl|nvidia|not found"; } >>"$out/environment.log"
    publish
  fi
fi
[ "$python_module" = 1 ] || record "python module" skip 0 "no Python.h, pybind11 or dlpack.h for python3"

if [ "$built" = 1 ]; then
  gate_only=1  # GPUCHECK_ONLY selects among the steps below
  # 3. The GPU's own C++ cases, with the libraries' own error logging on.
  export CUBLASLT_LOG_LEVEL=1 CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr NCCL_DEBUG=WARN
  run_step "ctest (cuda cases)" "$out/ctest-cuda.log" ctest --test-dir "$base/gpu" -j 4 --output-on-failure \
    --timeout 60 -R 'cuda0|Backends|Nccl|gpu_grid|StreamFromNative|cuda_libraries_(present|not_linked)|Monitor[.]Gpu|Telemetry[.]Gpu|Device[.]ParseFindsAVisibleDeviceByItsUuid|MigInstances'
  skipped=$(grep -c "(Skipped)" "$out/ctest-cuda.log" 2>/dev/null || true)
  record "cuda cases skipped" "$([ "${skipped:-0}" = 0 ] && echo ok || echo note)" 0 \
    "${skipped:-0} skipped (multi-GPU and MPI cases may): ctest-cuda.log"
  # 4. The Python package from the same build: the bindings' CUDA cases, the torch drop-ins.
  if [ "$python_module" = 1 ]; then
    pkg="$base/gpu/pkg/gpucloud"
    mkdir -p "$pkg" && cp -r python/gpucloud/. "$pkg"/ && cp "$base"/gpu/python/_core*.so "$pkg"/ 2>/dev/null
    pkg_root="$(cd "$base/gpu/pkg" && pwd)"
    export PYTHONPATH="$pkg_root${PYTHONPATH:+:$PYTHONPATH}"
    run_step "torch drop-ins on CUDA" "$out/pytest-torch-cuda.log" python3 -m pytest -q -rs -p no:cacheprovider \
      python/tests/test_torch_cuda.py
    run_step "pytest (cuda cases)" "$out/pytest-cuda.log" python3 -m pytest -q -rs -p no:cacheprovider -k cuda \
      python/tests --ignore=python/tests/test_torch_cuda.py
  fi
  # 5. Short training runs on the GPU.
  run_step "train_mlp on the GPU" "$out/train_mlp.log" "$base"/gpu/examples/train_mlp --device cuda --steps 400 \
    --log-every 100 --overflow-at 200
  run_step "train_cnn on the GPU" "$out/train_cnn.log" "$base"/gpu/examples/train_cnn --device cuda --steps 200
  # 5b. Restarts on the GPU (docs/fault-tolerance.md): train_mlp under gpucloud-run, SIGKILLed and
  # preempted at random steps, each job ending with the uninterrupted run's weights bit for bit
  # (a fresh CUDA context, cuBLASLt handles and checkpoint loads into device memory each time).
  if command -v mpirun >/dev/null 2>&1; then
    run_step "restarts on the GPU (kill)" "$out/faults-kill-cuda.log" python3 tests/elastic/fault_trials.py kill \
      --work "$base/faults-kill" --np 1 --trials 3 --per-job 3 --steps 1500 -- "$base"/gpu/examples/train_mlp --device cuda
    run_step "restarts on the GPU (preempt)" "$out/faults-preempt-cuda.log" python3 tests/elastic/fault_trials.py \
      preempt --work "$base/faults-preempt" --np 1 --trials 2 --per-job 2 --steps 1500 -- \
      "$base"/gpu/examples/train_mlp --device cuda
  else
    record "restarts on the GPU" skip 0 "mpirun is not installed"
  fi
  run_step devices_demo "$out/devices_demo.log" "$base"/gpu/examples/devices_demo
  reading="$(grep -E 'now \(|NVML:' "$out/devices_demo.log" 2>/dev/null | tail -n 2 | tr -s ' ' | tr '\n' ' ' | cut -c1-100)"
  record "device monitoring" "$(grep -q 'now (nvml)' "$out/devices_demo.log" 2>/dev/null && echo ok || echo note)" 0 \
    "${reading:-no reading}"
  # 5c. Topology: the GPUs' PCI placement and NUMA nodes (sysfs), NVML's link matrix (nvidia-smi
  # topo -m beside it, to compare), the binding advice per GPU.
  run_step "topology (C++)" "$out/topology.log" ctest --test-dir "$base/gpu" --output-on-failure --timeout 60 \
    -R '^(Topology|BindingAdvice)[.]'
  if [ "$python_module" = 1 ]; then
    run_step "python -m gpucloud topo" "$out/topo.log" sh -c 'python3 -m gpucloud topo && nvidia-smi topo -m'
    links="$(grep -E '^GPU0' "$out/topo.log" 2>/dev/null | head -n 1 | tr -s '\t ' ' ' | cut -c1-80)"
    record "GPU links (NVML)" "$(grep -q 'NVML unavailable' "$out/topo.log" 2>/dev/null && echo note || echo ok)" 0 \
      "${links:-no GPU row}"
  fi
  # 6-7. Probes, then trimmed sanitizer runs over the CUDA cases.
  if command -v compute-sanitizer >/dev/null; then
    sanitize() {  # sanitize TOOL BINARY FILTER
      run_step "$1 $2" "$out/$1-$2.log" compute-sanitizer --tool "$1" --error-exitcode 1 "$base/gpu/tests/$2" \
        --gtest_filter="$3"
    }
    sanitize memcheck test_gemm '*BiasAtAnyOffset*cuda0*'
    sanitize memcheck test_stream '*cuda0*:StreamFromNative.*'
    sanitize memcheck test_nccl 'NcclTimeout.*'
    for t in test_gemm test_conv test_optimizers test_loss_scaler test_copy_cast test_memory; do
      sanitize memcheck "$t" '*cuda0*'
    done
    sanitize racecheck test_nn_ops '*cuda0*'
    sanitize racecheck test_optimizers '*cuda0*'
  else
    record compute-sanitizer skip 0 "not on PATH"
  fi
  # 8. Benchmarks, last.
  for b in bench_gemm bench_conv bench_amp bench_data_movement; do
    [ -x "$base/gpu/bench/$b" ] || { record "$b" skip 0 "not built (no Google Benchmark)"; continue; }
    extra=()
    # Two ResNet-50 layers keep the convolution sweep (each GPU case also runs cudnnFind) in budget.
    [ "$b" = bench_conv ] && extra=(--benchmark_filter='layer:(2|6)/')
    run_step "$b" "$out/$b.json.log" "$base/gpu/bench/$b" --benchmark_out="$out/$b.json" \
      --benchmark_out_format=json --benchmark_min_time=0.2 "${extra[@]}"
  done
  if python3 -c "import torch, gpucloud; assert torch.cuda.is_available()" 2>/dev/null; then
    run_step "train step vs torch (fp16)" "$out/train_step_torch.log" python3 bench/bench_train_step_torch.py \
      --device cuda --dtype fp16 --json "$out/bench_train_step_torch.json"
  fi
fi

publish
echo
echo "gpu-check summary (${gpu:-no GPU}), ${SECONDS}s in all, budget ${budget}s"
echo "| step                               | result |  time   | detail |"
echo "|------------------------------------|--------|---------|--------|"
printf '%s\n' "${summary[@]}"
! grep -qF "| FAIL " "$out/summary.md"
