/// @file loss_scaler.hpp
/// @brief Dynamic (and static) loss scaling with PyTorch GradScaler's defaults and update rule.
#pragma once

#include <gpucloud/checkpoint/state_dict.hpp>
#include <gpucloud/export.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/device.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace gpucloud {

/// @brief The scaler's settings; the defaults are PyTorch GradScaler's.
struct LossScalerOptions {
  float init_scale = 65536.0f;  ///< starting scale (> 0, finite)
  double growth_factor = 2.0;   ///< scale *= growth after growth_interval finite steps (> 1); in double, as PyTorch
  double backoff_factor = 0.5;  ///< scale *= backoff on an overflow (in (0, 1)); in double, as PyTorch
  int growth_interval = 2000;   ///< finite steps between growths (>= 1)
  int hysteresis = 1;           ///< back off at the N-th overflow since the last back-off (DeepSpeed); 1 = every one
  float min_scale = 0.0f;       ///< floor for the scale; 0 = none
  bool dynamic = true;          ///< false: a static scale that never changes
};

/// @brief The scaler's state as the host sees it: for logging and checkpoints.
struct LossScalerState {
  float scale = 0.0f;                ///< current scale
  std::int32_t growth_tracker = 0;   ///< finite steps since the last growth or back-off
  std::int32_t hysteresis_left = 0;  ///< overflows still tolerated before the next back-off
  bool found_inf = false;            ///< a non-finite gradient was seen in the current step
};

/// @brief Loss scaling for mixed-precision training, with its state on the gradients' device.
///
/// A step: scale(loss) -> backward -> unscale(grads) -> optimizer.step(stream, &scaler) ->
/// update(). All of it is stream-ordered and reads the state on the device, so a step needs no
/// host synchronisation: the fused optimizers skip the step themselves when found-inf is set.
/// update() applies PyTorch's rule: on an overflow scale *= backoff and the tracker resets; on a
/// finite step the tracker counts up and at growth_interval scale *= growth (kept only if
/// finite) and the tracker resets. Then found-inf is cleared. Enqueued work holds the state: a
/// scaler destroyed while its work is queued stays alive until that work has run.
class GPUCLOUD_API LossScaler {
 public:
  /// @brief A scaler on @p device, its state initialised in @p stream's order (and freed in that
  ///        order: @p stream must outlive the scaler).
  /// @throws InvalidArgument for options out of range.
  LossScaler(Device device, StreamView stream, LossScalerOptions options = {});
  ~LossScaler();
  LossScaler(LossScaler&&) noexcept;             ///< Moves ownership.
  LossScaler& operator=(LossScaler&&) noexcept;  ///< Moves ownership.
  LossScaler(const LossScaler&) = delete;
  LossScaler& operator=(const LossScaler&) = delete;

  /// @brief values *= scale, in place (the loss before backward; fp32, fp16 or bf16).
  void scale(BufferView values, StreamView stream) const;
  /// @brief One fused pass over @p grads (fp32/fp16/bf16, any number, any sizes): g *= 1/scale in
  ///        place, found-inf set if any value was inf or NaN. Returns the number of launches.
  int unscale(const std::vector<BufferView>& grads, StreamView stream);
  /// @brief Applies the update rule and clears found-inf (end of every step).
  void update(StreamView stream);

  /// @brief Reads the state (synchronises @p stream).
  LossScalerState state(StreamView stream) const;
  /// @brief Restores a state (from a checkpoint) in @p stream's order. @throws InvalidArgument.
  void load_state(const LossScalerState& state, StreamView stream);

  /// @brief The state as named views of its device memory (no copies), for checkpoints: "scale"
  ///        (float32), "growth_tracker" and "hysteresis_left" (int32), one element each.
  StateDict state_dict() const;
  /// @brief Restores @p state, named as state_dict() (its views may be state_dict()'s own,
  ///        filled by checkpoint::load); validated as load_state. Synchronises @p stream.
  /// @throws InvalidArgument naming the entry; nothing is changed then.
  void load_state_dict(const StateDict& state, StreamView stream);

  /// @brief found-inf on the device: one float32, non-zero after an overflow this step.
  BufferView found_inf() const;
  /// @brief The scale on the device: one float32.
  BufferView scale_value() const;
  /// @brief The device of the state.
  Device device() const;
  /// @brief The options in force.
  const LossScalerOptions& options() const;

 private:
  friend class FusedSGD;  // a step reads found-inf, so it holds the state until it has run
  friend class FusedAdam;
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with enqueued work, which keeps the state alive
};

}  // namespace gpucloud
