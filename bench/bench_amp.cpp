// Mixed-precision step costs over a transformer's parameter set: the fused unscale of fp16
// gradients and the fused AdamW step with fp32 masters, in GB/s moved and launches per step.
//
// Bytes moved per element: unscale reads and writes a fp16 gradient (4 B); the AdamW step reads
// the fp16 gradient and the fp32 master, m and v, writes the master, m, v and the fp16 weight
// (2 + 12 + 12 + 2 = 28 B). Compare GB/s with the device's memory bandwidth (GPU_SPECS.md:
// H100 3350 GB/s, H200 4800 GB/s, A100 80GB 2039 GB/s; target >= 80 %).
#include <gpucloud/gpucloud.hpp>

#include <benchmark/benchmark.h>

#include "timing.hpp"
#include "transformer_shapes.hpp"

#include <numeric>

namespace gc = gpucloud;

namespace {

struct Model {
  std::vector<gc::Buffer> weights, grads;
  std::vector<gc::ParamGrad> params;
  std::vector<gc::BufferView> grad_views;
  std::size_t elements = 0;
  Model(gc::Device d, int layers, gc::DType t, gc::StreamView s) {
    for (std::size_t n : gc::bench::transformer_parameter_sizes(layers)) {
      weights.emplace_back(n, t, d, gc::MemoryKind::device);
      grads.emplace_back(n, t, d, gc::MemoryKind::device);
      gc::fill(weights.back(), 0.01, s);
      gc::fill(grads.back(), 1.0, s);
      params.push_back({weights.back(), grads.back()});
      grad_views.push_back(grads.back());
      elements += n;
    }
    s.synchronize();
  }
};

gc::Device device_of(int index) { return index == 0 ? gc::Device::host() : gc::Device::cuda(0); }
constexpr gc::DType kDtypes[] = {gc::DType::float32, gc::DType::float16, gc::DType::bfloat16};

// args: device (0 host, 1 cuda:0), layers (24 = GPT-2 medium, 350M parameters), dtype of the
// weights and gradients (0 fp32, 1 fp16, 2 bf16): a 16-bit loop is compared with the fp32 one's
// bytes per second.
void BM_Unscale(benchmark::State& state) {
  const gc::Device d = device_of(static_cast<int>(state.range(0)));
  const gc::DType t = kDtypes[state.range(2)];
  gc::Stream s(d);
  Model model(d, static_cast<int>(state.range(1)), t, s);
  gc::LossScalerOptions o;
  o.init_scale = 1.0f;  // keeps the values unchanged across iterations
  gc::LossScaler scaler(d, s, o);
  int launches = 0;
  gc::bench::run_timed(state, s, [&] { launches = scaler.unscale(model.grad_views, s); });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model.elements * 2 * gc::dtype_size(t)));
  state.counters["params_M"] = static_cast<double>(model.elements) / 1e6;
  state.counters["launches"] = launches;
  state.SetLabel(d.str() + " " + gc::dtype_name(t) + " grads");
}

void BM_AdamWStep(benchmark::State& state) {
  const gc::Device d = device_of(static_cast<int>(state.range(0)));
  const gc::DType t = kDtypes[state.range(2)];
  gc::Stream s(d);
  Model model(d, static_cast<int>(state.range(1)), t, s);
  gc::FusedAdam adam(model.params, gc::AdamOptions::adamw(), s);
  int launches = 0;
  gc::bench::run_timed(state, s, [&] { launches = adam.step(s); });
  // fp32: weights and gradient 4 + 4 + 4 B, moments 16 B; 16-bit: weight written 2 B, gradient 2 B,
  // fp32 master 8 B, moments 16 B: 28 B an element either way.
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * model.elements * 28));
  state.counters["params_M"] = static_cast<double>(model.elements) / 1e6;
  state.counters["launches"] = launches;
  state.SetLabel(d.str() + " " + gc::dtype_name(t) + (t == gc::DType::float32 ? " weights" : " weights, fp32 masters"));
}

void args(benchmark::internal::Benchmark* b) {
  for (int t = 0; t < 3; ++t) {
    b->Args({0, 2, t});  // the host: 2 layers (77M parameters) keeps a run short
    if (gc::cuda_device_count() > 0) b->Args({1, 24, t});
  }
  b->ArgNames({"device", "layers", "dtype"})->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

}  // namespace

BENCHMARK(BM_Unscale)->Apply(args);
BENCHMARK(BM_AdamWStep)->Apply(args);
BENCHMARK_MAIN();
