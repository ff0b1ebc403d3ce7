#include <gpucloud/amp/loss_scaler.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "amp/amp_checks.hpp"
#include "amp/amp_launch.hpp"
#include "checkpoint/state_checks.hpp"
#include "memory/access.hpp"
#include "runtime/stream_impl.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace gpucloud {

namespace {
using kernels::ScalerState;

void check_options(const LossScalerOptions& o) {
  constexpr double kMax = std::numeric_limits<float>::max();
  detail::check_range(o.init_scale, 0.0, kMax, true, "LossScaler", "options.init_scale");
  detail::check_range(o.growth_factor, 1.0, kMax, true, "LossScaler", "options.growth_factor");
  detail::check_range(o.backoff_factor, 0.0, 1.0, true, "LossScaler", "options.backoff_factor");
  GPUCLOUD_EXPECTS(o.backoff_factor < 1.0, "LossScaler", "options.backoff_factor: must be below 1");
  GPUCLOUD_EXPECTS(o.growth_interval >= 1, "LossScaler",
                   "options.growth_interval: " + std::to_string(o.growth_interval) + " must be at least 1");
  GPUCLOUD_EXPECTS(o.hysteresis >= 1, "LossScaler",
                   "options.hysteresis: " + std::to_string(o.hysteresis) + " must be at least 1");
  detail::check_range(o.min_scale, 0.0, o.init_scale, false, "LossScaler", "options.min_scale");
}

// Copies @p state onto the device in @p stream's order; the staging copy lives until it is done.
void upload_state(const ScalerState& state, BufferView device_state, StreamView stream) {
  auto staging = std::make_shared<Buffer>(sizeof(ScalerState), DType::uint8, Device::host(), MemoryKind::pinned);
  std::memcpy(staging->data(), &state, sizeof state);
  copy(device_state, staging->view(), stream);
  detail::hold_until_done(stream, std::move(staging));
}
}  // namespace

struct LossScaler::Impl {
  LossScalerOptions options;
  Buffer state;  // one ScalerState on the device
  ScalerState* device_state() const { return static_cast<ScalerState*>(state.data()); }
  kernels::ScalerRule rule() const {
    return kernels::ScalerRule{options.growth_factor, options.backoff_factor, options.growth_interval,
                               options.hysteresis,    options.min_scale,      options.dynamic};
  }
  void check_stream(StreamView s, const char* call) const {
    GPUCLOUD_EXPECTS(
        s.device() == state.device(), call,
        "stream: the scaler's state is on " + state.device().str() + ", the stream on " + s.device().str());
  }
};

LossScaler::LossScaler(Device device, StreamView stream, LossScalerOptions options) {
  check_options(options);
  GPUCLOUD_EXPECTS(stream.device() == device, "LossScaler",
                   "stream: the scaler lives on " + device.str() + ", the stream on " + stream.device().str());
  impl_ = std::make_shared<Impl>();
  impl_->options = options;
  // Stream-ordered: work enqueued on the state (from this constructor on) finishes before it is freed.
  impl_->state = Buffer(sizeof(ScalerState), DType::uint8, device, MemoryKind::device, stream);
  upload_state(ScalerState{options.init_scale, 0.0f, 0, options.hysteresis}, impl_->state.view(), stream);
}

LossScaler::~LossScaler() = default;
LossScaler::LossScaler(LossScaler&&) noexcept = default;
LossScaler& LossScaler::operator=(LossScaler&&) noexcept = default;

void LossScaler::scale(BufferView values, StreamView stream) const {
  impl_->check_stream(stream, "LossScaler::scale");
  detail::check_float_tensor(values, stream, "LossScaler::scale", "values");
  detail::amp::scale_by({{values}}, &impl_->device_state()->scale, stream);
  detail::hold_until_done(stream, impl_);
}

int LossScaler::unscale(const std::vector<BufferView>& grads, StreamView stream) {
  impl_->check_stream(stream, "LossScaler::unscale");
  detail::amp::Rows1 rows;
  rows.reserve(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    detail::check_float_tensor(grads[i], stream, "LossScaler::unscale", "grads[" + std::to_string(i) + "]");
    rows.push_back({grads[i]});
  }
  detail::check_disjoint(
      grads, [](std::size_t i) { return "grads[" + std::to_string(i) + "]"; }, "LossScaler::unscale");
  const int launches = detail::amp::unscale(rows, impl_->device_state(), stream);
  detail::hold_until_done(stream, impl_);
  return launches;
}

void LossScaler::update(StreamView stream) {
  impl_->check_stream(stream, "LossScaler::update");
  detail::amp::update_scale(impl_->device_state(), impl_->rule(), stream);
  detail::hold_until_done(stream, impl_);
}

LossScalerState LossScaler::state(StreamView stream) const {
  impl_->check_stream(stream, "LossScaler::state");
  Buffer host(sizeof(ScalerState), DType::uint8, Device::host(), MemoryKind::pinned);
  copy(host, impl_->state, stream);
  stream.synchronize();
  ScalerState s{};
  std::memcpy(&s, host.data(), sizeof s);
  return LossScalerState{s.scale, s.growth_tracker, s.hysteresis_left, s.found_inf != 0.0f};
}

void LossScaler::load_state(const LossScalerState& state, StreamView stream) {
  impl_->check_stream(stream, "LossScaler::load_state");
  detail::check_range(state.scale, 0.0, std::numeric_limits<float>::max(), true, "LossScaler::load_state",
                      "state.scale");
  GPUCLOUD_EXPECTS(state.growth_tracker >= 0 && state.growth_tracker < impl_->options.growth_interval,
                   "LossScaler::load_state",
                   "state.growth_tracker: " + std::to_string(state.growth_tracker) + " is not in [0, growth_interval)");
  GPUCLOUD_EXPECTS(state.hysteresis_left >= 1 && state.hysteresis_left <= impl_->options.hysteresis,
                   "LossScaler::load_state",
                   "state.hysteresis_left: " + std::to_string(state.hysteresis_left) + " is not in [1, hysteresis]");
  upload_state(ScalerState{state.scale, state.found_inf ? 1.0f : 0.0f, state.growth_tracker, state.hysteresis_left},
               impl_->state.view(), stream);
  detail::hold_until_done(stream, impl_);
}

StateDict LossScaler::state_dict() const {
  const Device dev = impl_->state.device();
  ScalerState* st = impl_->device_state();
  return {{"scale", {BufferView(&st->scale, 1, DType::float32, MemoryKind::device, dev), {}}},
          {"growth_tracker", {BufferView(&st->growth_tracker, 1, DType::int32, MemoryKind::device, dev), {}}},
          {"hysteresis_left", {BufferView(&st->hysteresis_left, 1, DType::int32, MemoryKind::device, dev), {}}}};
}

void LossScaler::load_state_dict(const StateDict& state, StreamView stream) {
  constexpr const char* call = "LossScaler::load_state_dict";
  impl_->check_stream(stream, call);
  detail::check_state_entries(state_dict(), state, call);
  LossScalerState s;
  detail::read_to_host(state.at("scale").view, &s.scale, sizeof s.scale, stream);
  detail::read_to_host(state.at("growth_tracker").view, &s.growth_tracker, sizeof s.growth_tracker, stream);
  detail::read_to_host(state.at("hysteresis_left").view, &s.hysteresis_left, sizeof s.hysteresis_left, stream);
  load_state(s, stream);
}

BufferView LossScaler::found_inf() const {
  return BufferView(&impl_->device_state()->found_inf, 1, DType::float32, MemoryKind::device, impl_->state.device());
}

BufferView LossScaler::scale_value() const {
  return BufferView(&impl_->device_state()->scale, 1, DType::float32, MemoryKind::device, impl_->state.device());
}

Device LossScaler::device() const { return impl_->state.device(); }

const LossScalerOptions& LossScaler::options() const { return impl_->options; }

}  // namespace gpucloud
