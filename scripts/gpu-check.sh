#!/usr/bin/env bash
# On a machine with a GPU: configure for the native architecture, build, run every test on both
# backends, run the CUDA test cases under compute-sanitizer (memcheck, racecheck), run every
# benchmark that exists, and print one summary table last. Budget: under 8 minutes on 16 cores.
#
# A GPU machine without Debian's libgtest-dev can use GoogleTest's sources carried along:
#   cp -r /usr/src/googletest .deps/googletest   (on a machine that has them; .deps is ignored)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/gpu-check}"
mkdir -p "$out" build
summary=()
record() { summary+=("$(printf '| %-34s | %-6s | %6ss | %s |' "$1" "$2" "$3" "$4")"); }
run_step() {  # run_step NAME LOG CMD...
  local name=$1 log=$2 t0=$SECONDS
  shift 2
  if "$@" >"$log" 2>&1; then record "$name" ok $((SECONDS - t0)) "$(tail -n 1 "$log" | cut -c1-70)"; return 0; fi
  record "$name" FAIL $((SECONDS - t0)) "see $log: $(tail -n 1 "$log" | cut -c1-60)"
  return 1
}

gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
echo "GPU: ${gpu:-none found}"
cfg=(-DCMAKE_BUILD_TYPE=Release -DGPUCLOUD_CUDA=ON -DGPUCLOUD_CUDA_ARCHS=native)
[ -f bench/CMakeLists.txt ] && cfg+=(-DGPUCLOUD_BUILD_BENCH=ON)
[ -d .deps/googletest ] && cfg+=(-DGPUCLOUD_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
command -v ninja >/dev/null && cfg+=(-G Ninja)
rm -rf build/gpu
if run_step configure "$out/configure.log" cmake -S . -B build/gpu "${cfg[@]}" &&
  run_step build "$out/build.log" cmake --build build/gpu -j "$(nproc)"; then
  run_step "ctest (host + cuda)" "$out/ctest.log" ctest --test-dir build/gpu -j 8 --output-on-failure --timeout 300
  skipped=$(grep -c "Skipped" "$out/ctest.log" || true)
  record "cuda cases skipped" "$([ "$skipped" = 0 ] && echo ok || echo FAIL)" 0 "$skipped skipped (0 expected on a GPU)"
  if command -v compute-sanitizer >/dev/null; then
    for t in test_stream test_memory test_copy_cast test_data_movement test_amp test_gemm test_conv test_nn_ops; do
      for tool in memcheck racecheck; do
        run_step "$tool $t" "$out/$tool-$t.log" compute-sanitizer --tool "$tool" --error-exitcode 1 \
          "build/gpu/tests/$t" --gtest_filter='*cuda0*:*Backends.*:HostStream.*'
      done
    done
  else
    record compute-sanitizer skip 0 "not on PATH"
  fi
  for b in build/gpu/bench/bench_*; do
    [ -x "$b" ] || continue
    extra=()
    # Two ResNet-50 layers keep the convolution sweep (each GPU case also runs cudnnFind) in budget.
    [ "$(basename "$b")" = bench_conv ] && extra=(--benchmark_filter='layer:(2|6)/')
    run_step "$(basename "$b")" "$out/$(basename "$b").json.log" "$b" --benchmark_out="$out/$(basename "$b").json" \
      --benchmark_out_format=json --benchmark_min_time=0.2 "${extra[@]}"
  done
  run_step "bench_collectives --nccl" "$out/bench_collectives_nccl.json.log" mpirun --allow-run-as-root -np 1 \
    build/gpu/bench/bench_collectives --nccl --benchmark_out="$out/bench_collectives_nccl.json" \
    --benchmark_out_format=json
  run_step devices_demo "$out/devices_demo.log" build/gpu/examples/devices_demo
  run_step "train_mlp on the GPU" "$out/train_mlp.log" build/gpu/examples/train_mlp --device cuda --steps 1000 \
    --log-every 250 --overflow-at 500
  run_step "train_cnn on the GPU" "$out/train_cnn.log" build/gpu/examples/train_cnn --device cuda --steps 600
  if python3 -c "import torch, gpucloud; assert torch.cuda.is_available()" 2>/dev/null; then
    run_step "train step vs torch (fp16)" "$out/train_step_torch.log" python3 bench/bench_train_step_torch.py \
      --device cuda --dtype fp16 --json "$out/bench_train_step_torch.json"
    run_step "conv vs torch (fp16, cuDNN)" "$out/conv_torch.log" python3 bench/bench_conv_torch.py --device cuda \
      --batch 64 --json "$out/bench_conv_torch.json"
  else
    record "train step vs torch" skip 0 "needs gpucloud installed (pip install .) and torch with CUDA"
  fi
fi

echo
echo "gpu-check summary (${gpu:-no GPU}), ${SECONDS}s in all"
echo "| step                               | result |  time   | detail |"
echo "|------------------------------------|--------|---------|--------|"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q "| FAIL "
