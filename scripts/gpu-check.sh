#!/usr/bin/env bash
# On a machine with a GPU: configure for the native architecture, build, run every test on both
# backends (C++ and Python), the training examples and every benchmark on the GPU, then the CUDA
# test cases under compute-sanitizer (memcheck, racecheck) as the budget allows, and print one
# summary table last. Each row is also printed as its step ends (and kept in summary.md), so a run
# cut short still reports what it did. Logs and benchmark JSON go to build/gpu-check; where $OUT is
# set (the device tool), summary.md, environment.log and a tarball of the rest are copied there.
#
# Budget: GPUCHECK_BUDGET seconds (default 480); a step that would start later is skipped and
# listed as such, one still running then is stopped and listed as CUT, and summary.md is copied to
# $OUT after every step (the first H200 run, 2026-12-04, spent its whole call in ctest and returned
# nothing). Steps run in order of what a first GPU run most needs to know. GPUCHECK_ARCHS
# (default native) sets the CUDA architectures, e.g. 80 to rehearse the script on a CPU machine.
#
# On the device machine (its image has CUDA, cuDNN and NCCL wheels, CMake, ninja, PyTorch; no
# GoogleTest, Google Benchmark, OpenBLAS, MPI or DLPack headers): run scripts/stage-gpu-deps.sh
# here first, then the device call with carry [".deps"] and `bash scripts/gpu-check.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=build/gpu-check
budget="${GPUCHECK_BUDGET:-480}"
rm -rf "$out"
mkdir -p "$out" build
: >"$out/summary.md"
summary=()
record() {
  local row
  row="$(printf '| %-34s | %-6s | %6ss | %s |' "$1" "$2" "$3" "$4")"
  summary+=("$row")
  echo "$row" | tee -a "$out/summary.md"
  # A run cut short by the device tool's limit still returns what it did.
  if [ -n "${OUT:-}" ]; then cp "$out/summary.md" "$OUT"/ 2>/dev/null; fi
}
run_step() {  # run_step NAME LOG CMD...
  local name=$1 log=$2 t0=$SECONDS
  shift 2
  if [ "$SECONDS" -ge "$budget" ]; then record "$name" skip 0 "over the ${budget}s budget"; return 1; fi
  # No step runs past the budget: one that would is stopped there (rc 124) and reported as cut.
  local rc=0
  timeout $((budget - SECONDS)) "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then record "$name" ok $((SECONDS - t0)) "$(tail -n 1 "$log" | cut -c1-70)"; return 0; fi
  if [ "$rc" = 124 ]; then
    record "$name" CUT $((SECONDS - t0)) "stopped at the ${budget}s budget; see $log: $(tail -n 1 "$log" | cut -c1-40)"
    return 1
  fi
  record "$name" FAIL $((SECONDS - t0)) "see $log: $(tail -n 1 "$log" | cut -c1-60)"
  return 1
}

# What the machine has, first: a new image's first run learns it from here.
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
{
  echo "GPU: ${gpu:-none found}"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1)"
  python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" 2>/dev/null
  python3 -c "import nvidia; print('nvidia wheels:', list(nvidia.__path__))" 2>/dev/null
  ls /usr/local/cuda/lib64 2>/dev/null | grep -E "^lib(cublas|cudnn|nccl)[^_]*\.so" | tr '\n' ' '
  echo
} | tee "$out/environment.log"

cfg=(-DCMAKE_BUILD_TYPE=Release -DGPUCLOUD_CUDA=ON -DGPUCLOUD_CUDA_ARCHS="${GPUCHECK_ARCHS:-native}")
# The Python module needs Python's headers, pybind11 and DLPack's header; without them the C++
# checks still run.
if { [ -d .deps/dlpack ] || [ -f /usr/include/dlpack/dlpack.h ]; } && python3 -c "import os, sysconfig, pybind11; assert os.path.exists(sysconfig.get_paths()['include'] + '/Python.h')" \
  2>/dev/null; then
  cfg+=(-DGPUCLOUD_BUILD_PYTHON=ON -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)")
  python_module=1
else
  record "python module" skip 0 "no Python.h, pybind11 or dlpack.h for python3"
  python_module=0
fi
[ -d .deps/googletest ] && cfg+=(-DGPUCLOUD_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
[ -d .deps/benchmark ] && cfg+=(-DCMAKE_PREFIX_PATH="$PWD/.deps/benchmark")
[ -d .deps/dlpack ] && cfg+=(-DGPUCLOUD_DLPACK_INCLUDE="$PWD/.deps/dlpack/include")
if [ -d .deps/benchmark ] || [ -f /usr/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkConfig.cmake ]; then
  cfg+=(-DGPUCLOUD_BUILD_BENCH=ON)
else
  record benchmarks skip 0 "no Google Benchmark (scripts/stage-gpu-deps.sh stages it)"
fi
command -v ninja >/dev/null && cfg+=(-G Ninja)
rm -rf build/gpu
if run_step configure "$out/configure.log" cmake -S . -B build/gpu "${cfg[@]}" &&
  run_step build "$out/build.log" cmake --build build/gpu -j "$(nproc)"; then
  # The GPU's own cases first (what no CPU machine can run), then the rest; 60 s a test at most.
  run_step "ctest (cuda cases)" "$out/ctest-cuda.log" ctest --test-dir build/gpu -j 8 --output-on-failure \
    --timeout 60 -R 'cuda0|Backends|Nccl|gpu_grid'
  run_step "ctest (host + cuda)" "$out/ctest.log" ctest --test-dir build/gpu -j 8 --output-on-failure --timeout 60
  skipped=$(grep -c "(Skipped)" "$out/ctest.log" || true)
  record "ctest cases skipped" "$([ "$skipped" = 0 ] && echo ok || echo note)" 0 \
    "$skipped skipped: multi-GPU and MPI cases may; read ctest.log"
  # The Python package from the same build: the bindings' CUDA cases, torch on the GPU.
  if [ "$python_module" = 1 ]; then
    pkg="build/gpu/pkg/gpucloud"
    mkdir -p "$pkg" && cp python/gpucloud/*.py python/gpucloud/*.pyi python/gpucloud/py.typed "$pkg"/ &&
      cp build/gpu/python/_core*.so "$pkg"/ 2>/dev/null
    export PYTHONPATH="$PWD/build/gpu/pkg${PYTHONPATH:+:$PYTHONPATH}"
    run_step "pytest (host + cuda)" "$out/pytest.log" python3 -m pytest -q -rs python/tests -p no:cacheprovider
  fi
  run_step "train_mlp on the GPU" "$out/train_mlp.log" build/gpu/examples/train_mlp --device cuda --steps 1000 \
    --log-every 250 --overflow-at 500
  run_step "train_cnn on the GPU" "$out/train_cnn.log" build/gpu/examples/train_cnn --device cuda --steps 600
  run_step devices_demo "$out/devices_demo.log" build/gpu/examples/devices_demo
  # The GPU's reading through NVML (source nvml), or why not.
  reading="$(grep -E 'now \(|NVML:' "$out/devices_demo.log" | tail -n 2 | tr -s ' ' | tr '\n' ' ' | cut -c1-100)"
  record "device monitoring" "$(grep -q 'now (nvml)' "$out/devices_demo.log" && echo ok || echo note)" 0 "$reading"
  for b in build/gpu/bench/bench_gemm build/gpu/bench/bench_conv build/gpu/bench/bench_amp \
    build/gpu/bench/bench_data_movement; do
    [ -x "$b" ] || continue
    extra=()
    # Two ResNet-50 layers keep the convolution sweep (each GPU case also runs cudnnFind) in budget.
    [ "$(basename "$b")" = bench_conv ] && extra=(--benchmark_filter='layer:(2|6)/')
    run_step "$(basename "$b")" "$out/$(basename "$b").json.log" "$b" --benchmark_out="$out/$(basename "$b").json" \
      --benchmark_out_format=json --benchmark_min_time=0.2 "${extra[@]}"
  done
  if [ -x build/gpu/bench/bench_collectives ] && command -v mpirun >/dev/null; then
    run_step "bench_collectives --nccl" "$out/bench_collectives_nccl.json.log" mpirun --allow-run-as-root -np 1 \
      build/gpu/bench/bench_collectives --nccl --benchmark_out="$out/bench_collectives_nccl.json" \
      --benchmark_out_format=json
  else
    record "bench_collectives --nccl" skip 0 "needs MPI (mpirun)"
  fi
  if python3 -c "import torch, gpucloud; assert torch.cuda.is_available()" 2>/dev/null; then
    run_step "train step vs torch (fp16)" "$out/train_step_torch.log" python3 bench/bench_train_step_torch.py \
      --device cuda --dtype fp16 --json "$out/bench_train_step_torch.json"
    run_step "conv vs torch (fp16, cuDNN)" "$out/conv_torch.log" python3 bench/bench_conv_torch.py --device cuda \
      --batch 64 --json "$out/bench_conv_torch.json"
  else
    record "vs torch" skip 0 "needs torch with CUDA and the gpucloud package"
  fi
  if command -v compute-sanitizer >/dev/null; then
    for t in test_loss_scaler test_optimizers test_gemm test_conv test_copy_cast test_nn_ops test_stream test_memory test_data_movement; do
      for tool in memcheck racecheck; do
        run_step "$tool $t" "$out/$tool-$t.log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "build/gpu/tests/$t" --gtest_filter='*cuda0*:*Backends.*:HostStream.*'
      done
    done
  else
    record compute-sanitizer skip 0 "not on PATH"
  fi
fi

if [ -n "${OUT:-}" ]; then
  cp "$out/summary.md" "$out/environment.log" "$OUT"/ 2>/dev/null
  tar -czf "$OUT/gpu-check-logs.tar.gz" -C build gpu-check 2>/dev/null
fi
echo
echo "gpu-check summary (${gpu:-no GPU}), ${SECONDS}s in all, budget ${budget}s"
echo "| step                               | result |  time   | detail |"
echo "|------------------------------------|--------|---------|--------|"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q "| FAIL "
