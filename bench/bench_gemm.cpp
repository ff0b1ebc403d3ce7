// GEMM throughput: TFLOP/s = 2 M N K batch / time for square and transformer-shaped products in
// each precision, as a percentage of the device's spec-sheet peak (GPU_SPECS.md) on a GPU, and,
// on the host, as a ratio to a direct OpenBLAS sgemm on the same buffers in the same run
// (target >= 0.95: the wrapper must cost nothing; the two alternate in every iteration and their
// results are compared); on a GPU, as a ratio to cuBLAS's
// cublasGemmStridedBatchedEx called directly on the same buffers (target >= 0.97).
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>
#if GPUCLOUD_BENCH_WITH_BLAS
#include <cblas.h>
#endif

#include "cuda_baselines.hpp"
#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

namespace gc = gpucloud;

namespace {

struct PrecisionCase {
  gc::DType in, out;
  bool tf32;
};
const PrecisionCase kCases[] = {
    {gc::DType::float32, gc::DType::float32, false},      {gc::DType::float32, gc::DType::float32, true},
    {gc::DType::float16, gc::DType::float16, false},      {gc::DType::bfloat16, gc::DType::bfloat16, false},
    {gc::DType::float8_e4m3, gc::DType::bfloat16, false},
};

gc::Device device_of(int index) { return index == 0 ? gc::Device::host() : gc::Device::cuda(0); }

// args: device, precision case, m, n, k, batch
void BM_Gemm(benchmark::State& state) {
  const gc::Device d = device_of(static_cast<int>(state.range(0)));
  const PrecisionCase& pc = kCases[state.range(1)];
  const gc::Precision precision = gc::gemm_precision(pc.in, pc.tf32);
  if (!gc::supports(d, precision)) {
    state.SkipWithError((std::string(gc::precision_name(precision)) + " unsupported on " + d.str()).c_str());
    return;
  }
  gc::GemmArgs g;
  g.m = state.range(2);
  g.n = state.range(3);
  g.k = state.range(4);
  g.batch = state.range(5);
  g.tf32 = pc.tf32;
  g.trans_b = gc::Transpose::transpose;  // C = A B^T: a linear layer, and fp8's layout
  gc::Stream s(d);
  gc::Buffer a(static_cast<std::size_t>(g.m * g.k * g.batch), pc.in, d),
      b(static_cast<std::size_t>(g.n * g.k * g.batch), pc.in, d);
  gc::Buffer c(static_cast<std::size_t>(g.m * g.n * g.batch), pc.out, d);
  gc::fill(a, 0.5, s);
  gc::fill(b, 0.25, s);
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k) *
                       static_cast<double>(g.batch);
#if GPUCLOUD_BENCH_WITH_BLAS
  if (d.is_host() && pc.in == gc::DType::float32 && !pc.tf32 && g.batch == 1) {
    // The peer on the host: the same product through OpenBLAS called directly on the calling
    // thread (no stream), on its own output buffer, alternating with gpucloud's call in every
    // iteration, both by the caller's wall clock (gpucloud's includes the hand-off to the stream);
    // the inputs varied and the two outputs compared at the end.
    gc::Buffer c_direct(c.size(), pc.out, d);
    for (std::size_t i = 0; i < a.size(); ++i)
      a.data_as<float>()[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
    for (std::size_t i = 0; i < b.size(); ++i) b.data_as<float>()[i] = static_cast<float>((i * 53) % 97) / 97.0f - 0.5f;
    auto direct = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(g.m), static_cast<int>(g.n),
                  static_cast<int>(g.k), 1.0f, a.data_as<float>(), static_cast<int>(g.k), b.data_as<float>(),
                  static_cast<int>(g.k), 0.0f, c_direct.data_as<float>(), static_cast<int>(g.n));
    };
    gc::gemm(c, a, b, g, s);  // warm-up, both
    s.synchronize();
    direct();
    const gc::bench::Alternated t = gc::bench::alternate_timed(
        state,
        [&] {
          gc::gemm(c, a, b, g, s);
          s.synchronize();
        },
        direct);
    for (std::size_t i = 0; i < c.size(); ++i) {
      const float x = c.data_as<float>()[i], y = c_direct.data_as<float>()[i];
      if (std::fabs(x - y) > 1e-5f * std::max(1.0f, std::fabs(y))) {
        state.SkipWithError(("element " + std::to_string(i) + " differs from OpenBLAS's").c_str());
        return;
      }
    }
    const double ms = t.ours * 1e3 / static_cast<double>(state.iterations());
    gc::bench::report_tflops(state, d, precision, flops, ms);
    state.counters["ratio_vs_openblas"] = t.theirs / t.ours;
    state.SetLabel(d.str() + " " + gc::precision_name(precision) + " -> " + gc::dtype_name(pc.out));
    return;
  }
#endif
  const double ms = gc::bench::run_timed(state, s, [&] { gc::gemm(c, a, b, g, s); });
  gc::bench::report_tflops(state, d, precision, flops, ms);
  if (d.is_cuda()) {
    s.synchronize();
    const double direct = gc::bench::cublas_gemm_ms(d.index(), a.data(), b.data(), c.data(), pc.in, pc.out, pc.tf32,
                                                    g.m, g.n, g.k, g.batch);
    if (direct > 0) state.counters["ratio_vs_cublas"] = direct / ms;
  }
  state.SetLabel(d.str() + " " + gc::precision_name(precision) + " -> " + gc::dtype_name(pc.out));
}

void args(benchmark::internal::Benchmark* b) {
  const bool gpu = gc::cuda_device_count() > 0;
  for (int p = 0; p < 5; ++p) {
    b->Args({0, p, 512, 512, 512, 1});
    b->Args({0, p, 1024, 1024, 1024, 1});
    b->Args({0, p, 128, 128, 64, 16});  // attention-like: batch of small products
  }
  if (gpu) {
    for (int p = 0; p < 5; ++p) {
      b->Args({1, p, 4096, 4096, 4096, 1});
      b->Args({1, p, 8192, 8192, 8192, 1});
      b->Args({1, p, 8192, 3072, 1024, 1});  // a transformer MLP projection
      b->Args({1, p, 2048, 2048, 128, 64});  // attention scores, 64 heads
    }
  }
  b->ArgNames({"device", "precision", "m", "n", "k", "batch"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_Gemm)->Apply(args);
BENCHMARK_MAIN();
