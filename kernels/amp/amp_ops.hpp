// Mixed-precision training math shared by the CUDA kernels and the host loops: the loss scaler's
// update rule (PyTorch GradScaler), the fused unscale + overflow check, scaling by a device
// factor, sum of squares for the global norm, and the fused SGD / Adam(W) updates
// (torch.optim definitions) with fp32 master weights.
#pragma once

#include <gpucloud/detail/hd.hpp>

#include "kernels/compute/host_convert.hpp"
#include "kernels/compute/host_nn_ops.hpp"
#include "kernels/launch/multi_tensor.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

// Marks the host loops written to vectorise: `omp simd` where the file is compiled with
// -fopenmp-simd (src/CMakeLists.txt sets GPUCLOUD_OMP_SIMD there), nothing elsewhere.
#if defined(GPUCLOUD_OMP_SIMD)
#define GPUCLOUD_HOST_SIMD _Pragma("omp simd")
#else
#define GPUCLOUD_HOST_SIMD
#endif

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

/// Sets the found-inf flag @p flag to 1. Several host threads may set it at once (the host splits
/// large launches over its cores): a relaxed atomic store there, a plain one on the GPU.
GPUCLOUD_HD inline void raise_found_inf(float* flag) {
#if defined(__CUDA_ARCH__)
  *flag = 1.0f;
#else
  const float one = 1.0f;
  __atomic_store(flag, &one, __ATOMIC_RELAXED);
#endif
}

/// Elements [begin, end) of @p slot times @p factor on the host (host::scale_array); true when one
/// of them was inf or NaN.
inline bool host_scale(const TensorListMeta<1>& m, int slot, std::int64_t begin, std::int64_t end, float factor) {
  const std::uint8_t t = m.types[0][slot];
  void* x = t == kF32 ? static_cast<void*>(static_cast<float*>(m.addresses[0][slot]) + begin)
                      : static_cast<void*>(static_cast<std::uint16_t*>(m.addresses[0][slot]) + begin);
  return host::scale_array(x, t, end - begin, factor);
}

/// g = g / scale in place; found_inf = 1 if any g is inf or NaN (Depth 1: the gradients).
struct UnscaleOp {
  ScalerState* state;
  GPUCLOUD_HD bool skip() const { return false; }
  GPUCLOUD_HD void operator()(const TensorListMeta<1>& m, int slot, std::int64_t i) const {
    const float v = load(m.addresses[0][slot], i, m.types[0][slot]);
    if (!is_finite(v)) raise_found_inf(&state->found_inf);
    store(m.addresses[0][slot], i, m.types[0][slot], v * (1.0f / state->scale));
  }
  /// The host's walk of elements [begin, end) of @p slot: the same, typed and vectorised.
  void host_range(const TensorListMeta<1>& m, int slot, std::int64_t begin, std::int64_t end) const {
    if (host_scale(m, slot, begin, end, 1.0f / state->scale)) raise_found_inf(&state->found_inf);
  }
};

/// x = x * (*factor) in place (Depth 1), e.g. the gradient-clipping coefficient.
struct ScaleByOp {
  const float* factor;
  GPUCLOUD_HD bool skip() const { return false; }
  GPUCLOUD_HD void operator()(const TensorListMeta<1>& m, int slot, std::int64_t i) const {
    store(m.addresses[0][slot], i, m.types[0][slot], load(m.addresses[0][slot], i, m.types[0][slot]) * *factor);
  }
  /// The host's walk of elements [begin, end) of @p slot: the same, typed and vectorised.
  void host_range(const TensorListMeta<1>& m, int slot, std::int64_t begin, std::int64_t end) const {
    (void)host_scale(m, slot, begin, end, *factor);
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

/// norm = sqrt(total), clip coefficient = min(max_norm / (norm + 1e-6), 1); @p total the sum of
/// the partial sums of squares.
GPUCLOUD_HD inline void finish_norm_total(double total, float max_norm, float* norm_out, float* coef_out) {
  const float norm = static_cast<float>(sqrt(total));
  *norm_out = norm;
  const float coef = max_norm / (norm + 1e-6f);
  *coef_out = coef < 1.0f ? coef : 1.0f;
}

/// After the partial sums, summed in order (the host; a GPU sums them with one block's tree).
GPUCLOUD_HD inline void finish_norm(const float* partials, std::int64_t count, float max_norm, float* norm_out,
                                    float* coef_out) {
  double total = 0.0;
  for (std::int64_t i = 0; i < count; ++i) total += partials[i];
  finish_norm_total(total, max_norm, norm_out, coef_out);
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

// The optimizers' per-element updates are templates on their loop-invariant settings, so the
// host's loops over fp32 arrays (host_range) have no control flow and vectorise; the kernels and
// every other dtype combination call the same update element by element.

/// Elements [begin, end) of the fp16/bf16 array @p src (type @p t) widened into @p dst: the host's
/// vectorised casts (host_convert.hpp), the same bits as load().
inline void host_to_fp32(float* dst, const void* src, std::uint8_t t, std::int64_t begin, std::int64_t end) {
  const std::uint16_t* s = static_cast<const std::uint16_t*>(src) + begin;
  const auto n = static_cast<std::size_t>(end - begin);
  if (t == kF16) return host::cast_array(dst, reinterpret_cast<const Half*>(s), n);
  host::cast_array(dst, reinterpret_cast<const BFloat16*>(s), n);
}

/// Elements [begin, end) of the fp32 masters @p src rounded into the model's weights @p dst (type
/// @p t): the vectorised casts, the same bits as store().
inline void host_from_fp32(void* dst, std::uint8_t t, const float* src, std::int64_t begin, std::int64_t end) {
  const auto n = static_cast<std::size_t>(end - begin);
  if (t == kF32) return (void)std::memcpy(static_cast<float*>(dst) + begin, src + begin, n * sizeof(float));
  std::uint16_t* d = static_cast<std::uint16_t*>(dst) + begin;
  if (t == kF16) return host::cast_array(reinterpret_cast<Half*>(d), src + begin, n);
  host::cast_array(reinterpret_cast<BFloat16*>(d), src + begin, n);
}

/// The gradients of elements [begin, end) of @p slot as fp32 for a host loop: the tensor itself
/// when it is fp32, else widened into @p scratch. Index the result with i - begin.
template <int Depth>
const float* host_grads_fp32(const TensorListMeta<Depth>& m, int slot, std::int64_t begin, std::int64_t end,
                             std::vector<float>& scratch) {
  if (m.types[1][slot] == kF32) return static_cast<const float*>(m.addresses[1][slot]) + begin;
  scratch.resize(static_cast<std::size_t>(end - begin));
  host_to_fp32(scratch.data(), m.addresses[1][slot], m.types[1][slot], begin, end);
  return scratch.data();
}

/// Lists of the fused SGD: 0 param (model dtype), 1 grad, 2 momentum (fp32), 3 master (fp32 or none).
struct SgdOp {
  const float* found_inf;
  const StepScalars* scalars;
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  float grad_sign;  // -1: maximize (torch negates the gradient first); exact either way
  GPUCLOUD_HD bool skip() const { return found_inf != nullptr && *found_inf != 0.0f; }
  /// The update of one weight @p p (fp32) with gradient @p g; @p buf its momentum buffer.
  template <bool Decay, bool Momentum, bool Nesterov, bool First>
  GPUCLOUD_HD float update(float p, float g, float* buf) const {
    g *= grad_sign;
    if constexpr (Decay) g += weight_decay * p;
    if constexpr (Momentum) {
      const float b = First ? g : momentum * *buf + (1.0f - dampening) * g;
      *buf = b;
      g = Nesterov ? g + momentum * b : b;
    }
    return p - lr * g;
  }
  /// Calls @p run.template go<Decay, Momentum, Nesterov, First>() for this step's settings.
  template <class Run>
  GPUCLOUD_HD void dispatch(const Run& run) const {
    const int code = (weight_decay != 0.0f ? 1 : 0) | (momentum != 0.0f ? 2 : 0) | (nesterov ? 4 : 0) |
                     (scalars->first_step != 0.0f ? 8 : 0);
    // clang-format off
    switch (code) {
#define GPUCLOUD_SGD_CASE(c) case c: return run.template go<(c & 1) != 0, (c & 2) != 0, (c & 4) != 0, (c & 8) != 0>();
      GPUCLOUD_SGD_CASE(0) GPUCLOUD_SGD_CASE(1) GPUCLOUD_SGD_CASE(2) GPUCLOUD_SGD_CASE(3)
      GPUCLOUD_SGD_CASE(4) GPUCLOUD_SGD_CASE(5) GPUCLOUD_SGD_CASE(6) GPUCLOUD_SGD_CASE(7)
      GPUCLOUD_SGD_CASE(8) GPUCLOUD_SGD_CASE(9) GPUCLOUD_SGD_CASE(10) GPUCLOUD_SGD_CASE(11)
      GPUCLOUD_SGD_CASE(12) GPUCLOUD_SGD_CASE(13) GPUCLOUD_SGD_CASE(14) GPUCLOUD_SGD_CASE(15)
#undef GPUCLOUD_SGD_CASE
      default: return;
    }
    // clang-format on
  }
  struct Element {  // one element of any dtype combination
    const SgdOp& op;
    const TensorListMeta<4>& m;
    int slot;
    std::int64_t i;
    template <bool D, bool M, bool N, bool F>
    GPUCLOUD_HD void go() const {
      const int w = m.types[3][slot] != kNone ? 3 : 0;  // where the fp32 truth of the weight lives
      float* buf = static_cast<float*>(m.addresses[2][slot]) + i;
      const float p = op.update<D, M, N, F>(load(m.addresses[w][slot], i, m.types[w][slot]),
                                            load(m.addresses[1][slot], i, m.types[1][slot]), buf);
      store(m.addresses[w][slot], i, m.types[w][slot], p);
      if (w == 3) store(m.addresses[0][slot], i, m.types[0][slot], p);  // rounded copy for the model
    }
  };
  GPUCLOUD_HD void operator()(const TensorListMeta<4>& m, int slot, std::int64_t i) const {
    dispatch(Element{*this, m, slot, i});
  }
  struct HostLoop {  // fp32 weights (or masters) and gradients as arrays: vectorised
    const SgdOp& op;
    float* __restrict p;
    const float* __restrict g;  // indexed from begin
    float* __restrict buf;
    std::int64_t begin, end;
    template <bool D, bool M, bool N, bool F>
    GPUCLOUD_HD void go() const {  // host only in practice: HD so the HD dispatch may call it
      const SgdOp o = op;          // a local copy: its fields stay in registers, no store can alias them
      GPUCLOUD_HOST_SIMD
      for (std::int64_t i = begin; i < end; ++i) p[i] = o.update<D, M, N, F>(p[i], g[i - begin], buf + i);
    }
  };
  /// Runs @p loop (dispatch) compiled for the CPU's vector width: AVX-512, AVX2 or the baseline
  /// (src/amp/amp_launch.cpp; the same operations in the same order in every version).
  static void host_loop(const HostLoop& loop);
  /// The host's walk of elements [begin, end) of @p slot.
  void host_range(const TensorListMeta<4>& m, int slot, std::int64_t begin, std::int64_t end) const {
    const int w = m.types[3][slot] != kNone ? 3 : 0;
    if (m.types[w][slot] != kF32) {  // fp16/bf16 weights without fp32 masters
      for (std::int64_t i = begin; i < end; ++i) (*this)(m, slot, i);
      return;
    }
    thread_local std::vector<float> scratch;  // widened fp16/bf16 gradients
    const float* g = host_grads_fp32(m, slot, begin, end, scratch);
    host_loop(HostLoop{*this, static_cast<float*>(m.addresses[w][slot]), g, static_cast<float*>(m.addresses[2][slot]),
                       begin, end});
    if (w == 3)
      host_from_fp32(m.addresses[0][slot], m.types[0][slot], static_cast<const float*>(m.addresses[3][slot]), begin,
                     end);
  }
};

/// Lists of the fused Adam / AdamW: 0 param, 1 grad, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq
/// (amsgrad, or none), 5 master (fp32, or none). Moments are fp32.
struct AdamOp {
  const float* found_inf;
  const StepScalars* scalars;
  float lr, beta1, beta2, eps, weight_decay;
  bool decoupled;   // AdamW
  float grad_sign;  // -1: maximize (torch negates the gradient first); exact either way
  GPUCLOUD_HD bool skip() const { return found_inf != nullptr && *found_inf != 0.0f; }
  /// The update of one weight @p p (fp32) with gradient @p g and its moments (@p max_sq: amsgrad's);
  /// @p step_size and @p bc2_sqrt are the step's bias corrections.
  template <bool Decay, bool Decoupled, bool Amsgrad>
  GPUCLOUD_HD float update(float p, float g, float* exp_avg, float* exp_avg_sq, float* max_sq, float step_size,
                           float bc2_sqrt) const {
    g *= grad_sign;
    if constexpr (Decay && Decoupled) p *= 1.0f - lr * weight_decay;
    if constexpr (Decay && !Decoupled) g += weight_decay * p;
    const float a = *exp_avg + (1.0f - beta1) * (g - *exp_avg);  // lerp, as torch.optim does
    const float v = beta2 * *exp_avg_sq + (1.0f - beta2) * g * g;
    *exp_avg = a;
    *exp_avg_sq = v;
    float second = v;
    if constexpr (Amsgrad) {
      const float old_max = *max_sq;
      second = old_max > v ? old_max : v;
      *max_sq = second;
    }
    const float denom = sqrtf(second) / bc2_sqrt + eps;
    return p - step_size * (a / denom);
  }
  /// Calls @p run.template go<Decay, Decoupled, Amsgrad>() for this step's settings.
  template <class Run>
  GPUCLOUD_HD void dispatch(const Run& run, bool amsgrad) const {
    const int code = (weight_decay != 0.0f ? 1 : 0) | (decoupled ? 2 : 0) | (amsgrad ? 4 : 0);
    // clang-format off
    switch (code) {
#define GPUCLOUD_ADAM_CASE(c) case c: return run.template go<(c & 1) != 0, (c & 2) != 0, (c & 4) != 0>();
      GPUCLOUD_ADAM_CASE(0) GPUCLOUD_ADAM_CASE(1) GPUCLOUD_ADAM_CASE(2) GPUCLOUD_ADAM_CASE(3)
      GPUCLOUD_ADAM_CASE(4) GPUCLOUD_ADAM_CASE(5) GPUCLOUD_ADAM_CASE(6) GPUCLOUD_ADAM_CASE(7)
#undef GPUCLOUD_ADAM_CASE
      default: return;
    }
    // clang-format on
  }
  struct Element {  // one element of any dtype combination
    const AdamOp& op;
    const TensorListMeta<6>& m;
    int slot;
    std::int64_t i;
    template <bool D, bool W, bool A>
    GPUCLOUD_HD void go() const {
      const int w = m.types[5][slot] != kNone ? 5 : 0;
      const float p = op.update<D, W, A>(
          load(m.addresses[w][slot], i, m.types[w][slot]), load(m.addresses[1][slot], i, m.types[1][slot]),
          static_cast<float*>(m.addresses[2][slot]) + i, static_cast<float*>(m.addresses[3][slot]) + i,
          static_cast<float*>(m.addresses[4][slot]) + i, op.scalars->step_size, op.scalars->bias_correction2_sqrt);
      store(m.addresses[w][slot], i, m.types[w][slot], p);
      if (w == 5) store(m.addresses[0][slot], i, m.types[0][slot], p);
    }
  };
  GPUCLOUD_HD void operator()(const TensorListMeta<6>& m, int slot, std::int64_t i) const {
    dispatch(Element{*this, m, slot, i}, m.types[4][slot] != kNone);
  }
  struct HostLoop {  // fp32 weights (or masters) and gradients as arrays: vectorised
    const AdamOp& op;
    float* __restrict p;
    const float* __restrict g;  // indexed from begin
    float* __restrict exp_avg;
    float* __restrict exp_avg_sq;
    float* __restrict max_sq;
    std::int64_t begin, end;
    template <bool D, bool W, bool A>
    GPUCLOUD_HD void go() const {  // host only in practice: HD so the HD dispatch may call it
      const float step_size = op.scalars->step_size, bc2 = op.scalars->bias_correction2_sqrt;
      const AdamOp o = op;  // a local copy: its fields stay in registers, no store can alias them
      GPUCLOUD_HOST_SIMD
      for (std::int64_t i = begin; i < end; ++i) {
        p[i] = o.update<D, W, A>(p[i], g[i - begin], exp_avg + i, exp_avg_sq + i, max_sq + i, step_size, bc2);
      }
    }
  };
  /// Runs @p loop (dispatch; @p amsgrad: with max_sq) compiled for the CPU's vector width, as
  /// SgdOp::host_loop.
  static void host_loop(const HostLoop& loop, bool amsgrad);
  /// The host's walk of elements [begin, end) of @p slot.
  void host_range(const TensorListMeta<6>& m, int slot, std::int64_t begin, std::int64_t end) const {
    const int w = m.types[5][slot] != kNone ? 5 : 0;
    if (m.types[w][slot] != kF32) {  // fp16/bf16 weights without fp32 masters
      for (std::int64_t i = begin; i < end; ++i) (*this)(m, slot, i);
      return;
    }
    thread_local std::vector<float> scratch;  // widened fp16/bf16 gradients
    const float* g = host_grads_fp32(m, slot, begin, end, scratch);
    host_loop(
        HostLoop{*this, static_cast<float*>(m.addresses[w][slot]), g, static_cast<float*>(m.addresses[2][slot]),
                 static_cast<float*>(m.addresses[3][slot]), static_cast<float*>(m.addresses[4][slot]), begin, end},
        m.types[4][slot] != kNone);
    if (w == 5)
      host_from_fp32(m.addresses[0][slot], m.types[0][slot], static_cast<const float*>(m.addresses[5][slot]), begin,
                     end);
  }
};

}  // namespace gpucloud::kernels
