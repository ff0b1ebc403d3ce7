// Convolution throughput: TFLOP/s = 2 N K OH OW (C/groups) R S / time for ResNet-50's layer
// shapes, forward, backward-data and backward-filter, in each precision. On a GPU, also the
// ratio to the fastest algorithm cuDNN's own Find measures, called directly on the same buffers
// in the same run (target >= 0.97: the wrapper must cost nothing), and the percentage of the
// spec-sheet peak. On the host: TFLOP/s of the im2col + OpenBLAS reference (batch 2).
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>

#include "cuda_baselines.hpp"
#include "timing.hpp"

#include <string>

namespace gc = gpucloud;

namespace {

struct Layer {
  const char* name;
  std::int64_t c, hw, k, rs, stride, pad;
};
// ResNet-50's distinct convolutions (He et al. 2016, table 1), input sizes at 224 x 224.
const Layer kResNet50[] = {
    {"conv1", 3, 224, 64, 7, 2, 3},
    {"res2_1x1_reduce", 256, 56, 64, 1, 1, 0},
    {"res2_3x3", 64, 56, 64, 3, 1, 1},
    {"res2_1x1_expand", 64, 56, 256, 1, 1, 0},
    {"res3_3x3_s2", 128, 56, 128, 3, 2, 1},
    {"res3_3x3", 128, 28, 128, 3, 1, 1},
    {"res4_3x3", 256, 14, 256, 3, 1, 1},
    {"res5_3x3", 512, 7, 512, 3, 1, 1},
    {"res5_1x1_expand", 512, 7, 2048, 1, 1, 0},
};
const gc::DType kDTypes[] = {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16};
const char* kPasses[] = {"forward", "backward_data", "backward_filter"};

// args: device, dtype, pass, layer, batch
void BM_Conv(benchmark::State& state) {
  const gc::Device d = state.range(0) == 0 ? gc::Device::host() : gc::Device::cuda(0);
  const gc::DType t = kDTypes[state.range(1)];
  const int pass = static_cast<int>(state.range(2));
  const Layer& l = kResNet50[state.range(3)];
  const gc::Precision precision = gc::gemm_precision(t, false);
  if (!gc::supports(d, precision)) {
    state.SkipWithError((std::string(gc::precision_name(precision)) + " unsupported on " + d.str()).c_str());
    return;
  }
  gc::ConvArgs a;
  a.n = state.range(4), a.c = l.c, a.h = l.hw, a.w = l.hw, a.k = l.k, a.r = l.rs, a.s = l.rs;
  a.stride_h = a.stride_w = l.stride, a.pad_h = a.pad_w = l.pad;
  a.layout = d.is_cuda() && t != gc::DType::float32 ? gc::ConvLayout::nhwc : gc::ConvLayout::nchw;
  const gc::ConvOutputSize o = gc::conv2d_output_size(a);
  gc::Stream s(d);
  gc::Buffer x(static_cast<std::size_t>(a.n * a.c * a.h * a.w), t, d);
  gc::Buffer y(static_cast<std::size_t>(a.n * a.k * o.h * o.w), t, d);
  gc::Buffer f(static_cast<std::size_t>(a.k * a.c * a.r * a.s), t, d);
  gc::fill(x, 0.5, s);
  gc::fill(y, 0.25, s);
  gc::fill(f, 0.125, s);
  auto run = [&] {
    if (pass == 0) gc::conv2d_forward(y, x, f, a, s);
    if (pass == 1) gc::conv2d_backward_data(x, y, f, a, s);
    if (pass == 2) gc::conv2d_backward_filter(f, x, y, a, s);
  };
  const double ms = gc::bench::run_timed(state, s, run);
  const double flops = 2.0 * static_cast<double>(a.n * a.k * o.h * o.w) * static_cast<double>(a.c * a.r * a.s);
  gc::bench::report_tflops(state, d, precision, flops, ms);
  if (d.is_cuda()) {
    s.synchronize();
    const auto kind = static_cast<gc::bench::ConvPassKind>(pass);
    const double direct = pass == 0   ? gc::bench::cudnn_conv_ms(0, a, kind, y.data(), x.data(), f.data(), t)
                          : pass == 1 ? gc::bench::cudnn_conv_ms(0, a, kind, x.data(), y.data(), f.data(), t)
                                      : gc::bench::cudnn_conv_ms(0, a, kind, f.data(), x.data(), y.data(), t);
    if (direct > 0) state.counters["ratio_vs_cudnn"] = direct / ms;
  }
  state.SetLabel(d.str() + " " + gc::dtype_name(t) + " " + kPasses[pass] + " " + l.name +
                 (a.layout == gc::ConvLayout::nhwc ? " nhwc" : " nchw"));
}

void args(benchmark::internal::Benchmark* b) {
  const bool gpu = gc::cuda_device_count() > 0;
  const std::int64_t layers = static_cast<std::int64_t>(sizeof kResNet50 / sizeof kResNet50[0]);
  for (std::int64_t pass = 0; pass < 3; ++pass) {
    for (std::int64_t layer = 0; layer < layers; ++layer) {
      b->Args({0, 0, pass, layer, 2});  // the host reference: fp32, batch 2
      if (gpu) {
        for (std::int64_t t = 0; t < 3; ++t) b->Args({1, t, pass, layer, 64});
      }
    }
  }
  b->ArgNames({"device", "dtype", "pass", "layer", "batch"})->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_Conv)->Apply(args);
BENCHMARK_MAIN();
