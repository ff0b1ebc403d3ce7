/// @file optimizers.hpp
/// @brief Fused multi-tensor optimizers (SGD, Adam, AdamW) with fp32 master weights, and
///        clipping by global L2 norm; the math is torch.optim's.
#pragma once

#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/checkpoint/state_dict.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace gpucloud {

/// @brief A parameter and its gradient (fp32, fp16 or bf16 each; same number of elements).
struct ParamGrad {
  BufferView param;  ///< the model's weights, updated in place
  BufferView grad;   ///< their gradient
};

/// @brief torch.optim.SGD's settings.
struct SgdOptions {
  float lr = 0.01f;            ///< learning rate (>= 0)
  float momentum = 0.0f;       ///< momentum factor (>= 0)
  float dampening = 0.0f;      ///< dampening for momentum
  float weight_decay = 0.0f;   ///< L2 penalty (>= 0)
  bool nesterov = false;       ///< Nesterov momentum (needs momentum > 0 and dampening 0)
  bool master_weights = true;  ///< keep fp32 masters for fp16/bf16 parameters
  bool maximize = false;       ///< ascend: the gradient is negated first (torch's maximize)
};

/// @brief torch.optim.Adam / AdamW's settings.
struct AdamOptions {
  float lr = 1e-3f;                     ///< learning rate (>= 0)
  float beta1 = 0.9f;                   ///< first-moment decay, in [0, 1)
  float beta2 = 0.999f;                 ///< second-moment decay, in [0, 1)
  float eps = 1e-8f;                    ///< added to the denominator (>= 0)
  float weight_decay = 0.0f;            ///< L2 penalty (Adam) or decoupled decay (AdamW), >= 0
  bool amsgrad = false;                 ///< keep the max of the second moments
  bool decoupled_weight_decay = false;  ///< true: AdamW
  bool master_weights = true;           ///< keep fp32 masters for fp16/bf16 parameters
  bool maximize = false;                ///< ascend: the gradient is negated first (torch's maximize)
  /// @brief AdamW's defaults (torch.optim.AdamW: weight_decay 0.01, decoupled).
  static AdamOptions adamw() {
    AdamOptions o;
    o.weight_decay = 1e-2f;
    o.decoupled_weight_decay = true;
    return o;
  }
};

/// @brief Fused multi-tensor SGD: one pass over all parameters per launch group.
///
/// Momentum buffers (and fp32 masters for fp16/bf16 parameters) live on the parameters' device.
/// With master weights the update is applied to the master in fp32 and the parameter receives
/// its rounded copy in the same pass. step() with a scaler is skipped on the device when the
/// scaler's found-inf is set: no parameter, buffer or step count changes.
class GPUCLOUD_API FusedSGD {
 public:
  /// @brief Takes @p params (all on one device), allocates its state, initialised (and freed) in
  ///        @p stream's order: @p stream must outlive the optimizer.
  FusedSGD(std::vector<ParamGrad> params, SgdOptions options, StreamView stream);
  ~FusedSGD();
  FusedSGD(FusedSGD&&) noexcept;             ///< Moves ownership.
  FusedSGD& operator=(FusedSGD&&) noexcept;  ///< Moves ownership.
  /// @brief One step; skipped on the device if @p scaler found an overflow. Returns launches.
  int step(StreamView stream, const LossScaler* scaler = nullptr);
  /// @brief Changes the learning rate for later steps.
  void set_lr(float lr);
  /// @brief Changes every hyperparameter for later steps (a scheduler's betas or weight decay).
  /// @throws InvalidArgument naming the option out of range, or one that shapes the state and is
  ///         fixed at construction (momentum switched on or off, master_weights); nothing is changed then.
  void set_options(const SgdOptions& options);
  /// @brief Replaces the gradients later steps read (a framework's new gradient tensors), one per
  ///        parameter, in order: same sizes, reachable from @p stream's device, each its own memory.
  /// @throws InvalidArgument naming the gradient; nothing is changed then.
  void set_grads(const std::vector<BufferView>& grads, StreamView stream);
  /// @brief Completed (not skipped) steps; synchronises @p stream.
  std::size_t step_count(StreamView stream) const;
  /// @brief Sets the step count (restoring a checkpoint), in @p stream's order.
  void load_step_count(std::size_t steps, StreamView stream);
  /// @brief The state as named views of its memory (no copies), for checkpoints: "step" (int64,
  ///        one element) and, per parameter i, "state.<i>.momentum_buffer" (with momentum) and
  ///        "state.<i>.master" (fp32 masters of fp16/bf16 parameters). Read in the state's stream order.
  StateDict state_dict() const;
  /// @brief Restores @p state, named and shaped as state_dict() (its views may be state_dict()'s
  ///        own, filled by checkpoint::load), in @p stream's order; each parameter is then set from
  ///        its restored master. Reads the step count: synchronises @p stream.
  /// @throws InvalidArgument naming the entry (missing, unexpected, another dtype or size, a
  ///         negative step); nothing is changed then.
  void load_state_dict(const StateDict& state, StreamView stream);
  /// @brief Momentum buffer of parameter @p i (fp32), empty without momentum.
  BufferView momentum_buffer(std::size_t i) const;
  /// @brief fp32 master of parameter @p i, empty when the parameter is fp32 itself.
  BufferView master(std::size_t i) const;
  /// @brief The options in force.
  const SgdOptions& options() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with queued steps, which keep the state alive
};

/// @brief Fused multi-tensor Adam / AdamW (AdamOptions::decoupled_weight_decay), amsgrad optional.
///
/// Same contract as FusedSGD; the step count and bias corrections are kept on the device.
class GPUCLOUD_API FusedAdam {
 public:
  /// @brief Takes @p params (all on one device), allocates its state, initialised (and freed) in
  ///        @p stream's order: @p stream must outlive the optimizer.
  FusedAdam(std::vector<ParamGrad> params, AdamOptions options, StreamView stream);
  ~FusedAdam();
  FusedAdam(FusedAdam&&) noexcept;             ///< Moves ownership.
  FusedAdam& operator=(FusedAdam&&) noexcept;  ///< Moves ownership.
  /// @brief One step; skipped on the device if @p scaler found an overflow. Returns launches.
  int step(StreamView stream, const LossScaler* scaler = nullptr);
  /// @brief Changes the learning rate for later steps.
  void set_lr(float lr);
  /// @brief Changes every hyperparameter for later steps (a scheduler's betas or weight decay).
  /// @throws InvalidArgument naming the option out of range, or one that shapes the state and is
  ///         fixed at construction (amsgrad, master_weights); nothing is changed then.
  void set_options(const AdamOptions& options);
  /// @brief Replaces the gradients later steps read (a framework's new gradient tensors), one per
  ///        parameter, in order: same sizes, reachable from @p stream's device, each its own memory.
  /// @throws InvalidArgument naming the gradient; nothing is changed then.
  void set_grads(const std::vector<BufferView>& grads, StreamView stream);
  /// @brief Completed (not skipped) steps; synchronises @p stream.
  std::size_t step_count(StreamView stream) const;
  /// @brief Sets the step count (restoring a checkpoint), in @p stream's order.
  void load_step_count(std::size_t steps, StreamView stream);
  /// @brief The state as named views of its memory (no copies), for checkpoints: "step" (int64,
  ///        one element) and, per parameter i, "state.<i>.exp_avg", "state.<i>.exp_avg_sq",
  ///        "state.<i>.max_exp_avg_sq" (amsgrad) and
  ///        "state.<i>.master" (fp32 masters of fp16/bf16 parameters). Read in the state's stream order.
  StateDict state_dict() const;
  /// @brief Restores @p state, named and shaped as state_dict() (its views may be state_dict()'s
  ///        own, filled by checkpoint::load), in @p stream's order; each parameter is then set from
  ///        its restored master. Reads the step count: synchronises @p stream.
  /// @throws InvalidArgument naming the entry (missing, unexpected, another dtype or size, a
  ///         negative step); nothing is changed then.
  void load_state_dict(const StateDict& state, StreamView stream);
  /// @brief First moment of parameter @p i (fp32).
  BufferView exp_avg(std::size_t i) const;
  /// @brief Second moment of parameter @p i (fp32).
  BufferView exp_avg_sq(std::size_t i) const;
  /// @brief Max of second moments (amsgrad), else empty.
  BufferView max_exp_avg_sq(std::size_t i) const;
  /// @brief fp32 master of parameter @p i, empty when the parameter is fp32 itself.
  BufferView master(std::size_t i) const;
  /// @brief The options in force.
  const AdamOptions& options() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with queued steps, which keep the state alive
};

/// @brief Scales @p grads in place so their global L2 norm is at most @p max_norm
///        (torch.nn.utils.clip_grad_norm_: coefficient min(max_norm / (norm + 1e-6), 1)).
/// @return the total norm before clipping: one float32 on the device, ordered on @p stream.
GPUCLOUD_API Buffer clip_grad_norm(const std::vector<BufferView>& grads, float max_norm, StreamView stream);

/// @brief The global L2 norm of @p tensors (fused), one float32 on the device.
GPUCLOUD_API Buffer global_norm(const std::vector<BufferView>& tensors, StreamView stream);

}  // namespace gpucloud
