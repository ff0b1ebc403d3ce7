// Mixed-precision training math shared by the CUDA kernels and the host loops: the loss scaler's
// update rule (PyTorch GradScaler), the fused unscale + overflow check, scaling by a device
// factor, sum of squares for the global norm, and the fused SGD / Adam(W) updates
// (torch.optim definitions) with fp32 master weights.
#pragma once

#include <gpucloud/detail/hd.hpp>

#include "kernels/launch/multi_tensor.hpp"

#include <cmath>
#include <cstdint>

namespace gpucloud::kernels {

/// The loss scaler's state, kept in device memory next to the gradients.
struct ScalerState {
  float scale;
  float found_inf;               // != 0: a non-finite gradient was seen this step
  std::int32_t growth_tracker;   // finite steps since the last growth or back-off
  std::int32_t hysteresis_left;  // overflows still tolerated before backing off
};

/// The update rule's parameters.
struct ScalerRule {
  double growth_factor;  // double, as PyTorch's _amp_update_scale_: the product is rounded to fp32 once
  double backoff_factor;
  std::int32_t growth_interval;
  std::int32_t hysteresis;  // 1: back off at every overflow (PyTorch)
  float min_scale;          // 0: no floor
  bool dynamic;             // false: a static scale, only found_inf is reset
};

/// One scaler update at the end of a step (PyTorch's _amp_update_scale_, plus DeepSpeed's
/// optional hysteresis and minimum scale), then found_inf is cleared for the next step.
GPUCLOUD_HD inline void update_scale(ScalerState* s, ScalerRule r) {
  if (r.dynamic) {
    if (s->found_inf != 0.0f) {
      if (s->hysteresis_left > 1) {
        --s->hysteresis_left;
      } else {
        const float backed_off = static_cast<float>(s->scale * r.backoff_factor);
        s->scale = backed_off > r.min_scale ? backed_off : r.min_scale;
        s->hysteresis_left = r.hysteresis;
      }
      s->growth_tracker = 0;
    } else {
      const std::int32_t successful = s->growth_tracker + 1;
      if (successful == r.growth_interval) {
        const float grown = static_cast<float>(s->scale * r.growth_factor);
        if (is_finite(grown)) s->scale = grown;
        s->growth_tracker = 0;
      } else {
        s->growth_tracker = successful;
      }
    }
  }
  s->found_inf = 0.0f;
}

/// g = g / scale in place; found_inf = 1 if any g is inf or NaN (Depth 1: the gradients).
struct UnscaleOp {
  ScalerState* state;
  GPUCLOUD_HD bool skip() const { return false; }
  GPUCLOUD_HD void operator()(const TensorListMeta<1>& m, int slot, std::int64_t i) const {
    const float v = load(m.addresses[0][slot], i, m.types[0][slot]);
    if (!is_finite(v)) state->found_inf = 1.0f;
    store(m.addresses[0][slot], i, m.types[0][slot], v * (1.0f / state->scale));
  }
};

/// x = x * (*factor) in place (Depth 1), e.g. the gradient-clipping coefficient.
struct ScaleByOp {
  const float* factor;
  GPUCLOUD_HD bool skip() const { return false; }
  GPUCLOUD_HD void operator()(const TensorListMeta<1>& m, int slot, std::int64_t i) const {
    store(m.addresses[0][slot], i, m.types[0][slot], load(m.addresses[0][slot], i, m.types[0][slot]) * *factor);
  }
};

/// Sum of squares of one thread's share of block t.block (Depth 1); blocks then reduce their
/// threads' sums (CUB on the GPU, a loop on the host).
GPUCLOUD_HD inline float thread_sum_of_squares(ThreadIndex t, Grid g, const TensorListMeta<1>& m) {
  float sum = 0.0f;
  if (static_cast<std::int32_t>(t.block) >= m.blocks) return sum;
  const BlockChunk<1> c = chunk_of(m, t.block);
  for (std::int64_t i = c.begin + t.thread; i < c.end; i += g.threads) {
    const float v = load(m.addresses[0][c.slot], i, m.types[0][c.slot]);
    sum += v * v;
  }
  return sum;
}

/// After the partial sums: norm = sqrt(sum), clip coefficient = min(max_norm / (norm + 1e-6), 1).
GPUCLOUD_HD inline void finish_norm(const float* partials, std::int64_t count, float max_norm, float* norm_out,
                                    float* coef_out) {
  double total = 0.0;
  for (std::int64_t i = 0; i < count; ++i) total += partials[i];
  const float norm = static_cast<float>(sqrt(total));
  *norm_out = norm;
  const float coef = max_norm / (norm + 1e-6f);
  *coef_out = coef < 1.0f ? coef : 1.0f;
}

/// Step bookkeeping on the device: the step count and the bias-corrected factors, skipped with
/// the step when found_inf is set.
struct StepScalars {
  std::int64_t step;  // completed steps (an integer: a float stops counting at 2^24)
  float step_size;    // Adam: lr / (1 - beta1^step)
  float bias_correction2_sqrt;
  float first_step;  // SGD: 1 on the first step (momentum buffer = gradient)
};

GPUCLOUD_HD inline void begin_step(StepScalars* s, const float* found_inf, double lr, double beta1, double beta2) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  s->step += 1;
  const double bc1 = 1.0 - pow(beta1, static_cast<double>(s->step));
  const double bc2 = 1.0 - pow(beta2, static_cast<double>(s->step));
  s->step_size = static_cast<float>(lr / bc1);
  s->bias_correction2_sqrt = static_cast<float>(sqrt(bc2));
  s->first_step = s->step == 1 ? 1.0f : 0.0f;
}

/// Lists of the fused SGD: 0 param (model dtype), 1 grad, 2 momentum (fp32), 3 master (fp32 or none).
struct SgdOp {
  const float* found_inf;
  const StepScalars* scalars;
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  GPUCLOUD_HD bool skip() const { return found_inf != nullptr && *found_inf != 0.0f; }
  GPUCLOUD_HD void operator()(const TensorListMeta<4>& m, int slot, std::int64_t i) const {
    const bool master = m.types[3][slot] != kNone;
    const int w = master ? 3 : 0;  // where the fp32 truth of the weight lives
    float p = load(m.addresses[w][slot], i, m.types[w][slot]);
    float g = load(m.addresses[1][slot], i, m.types[1][slot]);
    if (weight_decay != 0.0f) g += weight_decay * p;
    if (momentum != 0.0f) {
      float* buf = static_cast<float*>(m.addresses[2][slot]);
      const float b = scalars->first_step != 0.0f ? g : momentum * buf[i] + (1.0f - dampening) * g;
      buf[i] = b;
      g = nesterov ? g + momentum * b : b;
    }
    p -= lr * g;
    store(m.addresses[w][slot], i, m.types[w][slot], p);
    if (master) store(m.addresses[0][slot], i, m.types[0][slot], p);  // rounded copy for the model
  }
};

/// Lists of the fused Adam / AdamW: 0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq
/// (amsgrad, or none), 5 master (fp32, or none). Moments are fp32.
struct AdamOp {
  const float* found_inf;
  const StepScalars* scalars;
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;  // AdamW
  GPUCLOUD_HD bool skip() const { return found_inf != nullptr && *found_inf != 0.0f; }
  GPUCLOUD_HD void operator()(const TensorListMeta<6>& m, int slot, std::int64_t i) const {
    const bool master = m.types[5][slot] != kNone;
    const int w = master ? 5 : 0;
    float p = load(m.addresses[w][slot], i, m.types[w][slot]);
    float g = load(m.addresses[1][slot], i, m.types[1][slot]);
    if (weight_decay != 0.0f) {
      if (decoupled) {
        p *= 1.0f - lr * weight_decay;
      } else {
        g += weight_decay * p;
      }
    }
    float* exp_avg = static_cast<float*>(m.addresses[2][slot]);
    float* exp_avg_sq = static_cast<float*>(m.addresses[3][slot]);
    const float a = exp_avg[i] + (1.0f - beta1) * (g - exp_avg[i]);  // lerp, as torch.optim does
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = a;
    exp_avg_sq[i] = v;
    float second = v;
    if (m.types[4][slot] != kNone) {  // amsgrad
      float* max_sq = static_cast<float*>(m.addresses[4][slot]);
      second = max_sq[i] > v ? max_sq[i] : v;
      max_sq[i] = second;
    }
    const float denom = sqrtf(second) / scalars->bias_correction2_sqrt + eps;
    p -= scalars->step_size * (a / denom);
    store(m.addresses[w][slot], i, m.types[w][slot], p);
    if (master) store(m.addresses[0][slot], i, m.types[0][slot], p);
  }
};

}  // namespace gpucloud::kernels
