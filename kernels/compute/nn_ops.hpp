// Bodies of the training-step ops (host loops and CUDA kernels share them).
#pragma once

#include "kernels/launch/launch.hpp"
#include "kernels/launch/multi_tensor.hpp"

#if !defined(__CUDA_ARCH__)
#include "kernels/compute/host_nn_ops.hpp"
#endif

#include <cstdint>

namespace gpucloud::kernels {

/// grad[i] = 2 (pred - target) / n * scale; partial squared errors per thread into partials.
struct MseBody {
  const void* pred;
  const void* target;
  void* grad;
  std::uint8_t pred_t, target_t, grad_t;
  std::int64_t n;
  const float* scale;  // the loss scale on the device, or nullptr
  float* partials;     // one per thread of the grid
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
    const float s = scale != nullptr ? *scale : 1.0f;
    float sum = 0.0f;
    const std::size_t gi = global_index(t, g);
    for (std::size_t i = gi; i < static_cast<std::size_t>(n); i += grid_size(g)) {
      const float d =
          load(pred, static_cast<std::int64_t>(i), pred_t) - load(target, static_cast<std::int64_t>(i), target_t);
      sum += d * d;
      store(grad, static_cast<std::int64_t>(i), grad_t, 2.0f * d / static_cast<float>(n) * s);
    }
    partials[gi] = sum;
  }
};

/// loss = total / n, @p total the sum of the partials.
GPUCLOUD_HD inline void finish_mse_total(double total, std::int64_t n, float* loss) {
  *loss = static_cast<float>(total / static_cast<double>(n));
}

/// loss = sum(partials) / n, summed in order (the host; a GPU sums them with one block's tree).
GPUCLOUD_HD inline void finish_mse(const float* partials, std::int64_t count, std::int64_t n, float* loss) {
  double total = 0.0;
  for (std::int64_t i = 0; i < count; ++i) total += partials[i];
  finish_mse_total(total, n, loss);
}

/// grad *= (activation > 0). A host thread walking the whole range runs the typed loop of
/// host_nn_ops.hpp (the same results).
struct ReluBackwardBody {
  void* grad;
  const void* act;
  std::uint8_t grad_t, act_t;
  std::int64_t n;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
#if !defined(__CUDA_ARCH__)
    if (grid_size(g) == 1) {
      host::relu_backward(grad, act, grad_t, act_t, n);
      return;
    }
#endif
    for (std::size_t i = global_index(t, g); i < static_cast<std::size_t>(n); i += grid_size(g)) {
      const auto k = static_cast<std::int64_t>(i);
      const float v = load(grad, k, grad_t);
      // Branch-free (a select): half the activations are negative, a branch mispredicts on them.
      store(grad, k, grad_t, load(act, k, act_t) > 0.0f ? v : 0.0f);
    }
  }
};

/// out[j] = sum_i grad[i * cols + j], each column's rows summed in order in fp32. A thread owns a
/// contiguous run of columns: one on a GPU-sized grid (neighbouring threads read neighbouring
/// columns: coalesced); many on the host's one-thread walk, where strips of kStrip columns are
/// summed row by row so memory is read in order (column by column would stride through it).
struct BiasGradBody {
  static constexpr int kStrip = 32;
  const void* grad;
  void* out;
  std::uint8_t grad_t, out_t;
  std::int64_t rows, cols;
  GPUCLOUD_HD void operator()(ThreadIndex t, Grid g) const {
#if !defined(__CUDA_ARCH__)
    if (grid_size(g) == 1) {  // the host's one-thread walk: the typed loop (the same sums, in order)
      host::bias_grad(grad, out, grad_t, out_t, rows, cols);
      return;
    }
#endif
    const auto threads = static_cast<std::int64_t>(grid_size(g));
    const std::int64_t per = (cols + threads - 1) / threads;
    const std::int64_t j0 = static_cast<std::int64_t>(global_index(t, g)) * per;
    const std::int64_t j1 = j0 + per < cols ? j0 + per : cols;
    if (per == 1) {
      if (j0 >= cols) return;
      float sum = 0.0f;
      for (std::int64_t i = 0; i < rows; ++i) sum += load(grad, i * cols + j0, grad_t);
      store(out, j0, out_t, sum);
      return;
    }
    for (std::int64_t jb = j0; jb < j1; jb += kStrip) {
      const int w = static_cast<int>(j1 - jb < kStrip ? j1 - jb : kStrip);
      float acc[kStrip];
      for (int q = 0; q < w; ++q) acc[q] = 0.0f;
      for (std::int64_t i = 0; i < rows; ++i) {
        for (int q = 0; q < w; ++q) acc[q] += load(grad, i * cols + jb + q, grad_t);
      }
      for (int q = 0; q < w; ++q) store(out, jb + q, out_t, acc[q]);
    }
  }
};

}  // namespace gpucloud::kernels
