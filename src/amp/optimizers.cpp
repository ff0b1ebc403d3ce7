#include <gpucloud/amp/optimizers.hpp>
#include <gpucloud/compute/cast.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/error.hpp>

#include "amp/amp_checks.hpp"
#include "amp/amp_launch.hpp"
#include "checkpoint/state_checks.hpp"
#include "memory/access.hpp"
#include "memory/workspace.hpp"
#include "runtime/stream_impl.hpp"

#include <cstring>
#include <limits>

namespace gpucloud {

namespace {
using kernels::StepScalars;

// What both optimizers keep: the parameters, their fp32 masters, the step scalars.
struct Common {
  std::vector<ParamGrad> params;
  std::vector<Buffer> masters;  // empty Buffer for fp32 parameters
  Buffer scalars;               // one StepScalars on the device
  Device device = Device::host();

  void init(std::vector<ParamGrad> p, bool master_weights, StreamView s, const char* call) {
    GPUCLOUD_EXPECTS(!p.empty(), call, "params: empty list");
    device = s.device();
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::string name = "params[" + std::to_string(i) + "]";
      detail::check_float_tensor(p[i].param, s, call, name + ".param");
      detail::check_float_tensor(p[i].grad, s, call, name + ".grad");
      GPUCLOUD_EXPECTS(p[i].param.size() == p[i].grad.size(), call,
                       name + ".grad: " + std::to_string(p[i].grad.size()) + " elements for a parameter of " +
                           std::to_string(p[i].param.size()));
    }
    // Every parameter and gradient is its own memory: a duplicate or a parameter that is its own
    // gradient would be updated twice (or read after its update) in one fused pass.
    std::vector<BufferView> all;
    for (const auto& pg : p) {
      all.push_back(pg.param);
      all.push_back(pg.grad);
    }
    detail::check_disjoint(
        all, [](std::size_t k) { return "params[" + std::to_string(k / 2) + "]." + (k % 2 == 0 ? "param" : "grad"); },
        call);
    params = std::move(p);
    for (const auto& pg : params) {
      if (master_weights && pg.param.dtype() != DType::float32) {
        Buffer m(pg.param.size(), DType::float32, device, MemoryKind::device, s);
        cast(m, pg.param, s);  // the master starts as the exact widening of the weight
        masters.push_back(std::move(m));
      } else {
        masters.emplace_back();
      }
    }
    scalars = Buffer(sizeof(StepScalars), DType::uint8, device, MemoryKind::device, s);
    fill(scalars, 0.0, s);
  }

  // Replaces the gradients: the same count and sizes, reachable from @p s, each its own memory.
  void set_grads(const std::vector<BufferView>& grads, StreamView s, const char* call) {
    GPUCLOUD_EXPECTS(s.device() == device, call,
                     "stream: the parameters are on " + device.str() + ", the stream on " + s.device().str());
    GPUCLOUD_EXPECTS(
        grads.size() == params.size(), call,
        "grads: " + std::to_string(grads.size()) + " gradients for " + std::to_string(params.size()) + " parameters");
    std::vector<BufferView> all;
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const std::string name = "grads[" + std::to_string(i) + "]";
      detail::check_float_tensor(grads[i], s, call, name);
      GPUCLOUD_EXPECTS(grads[i].size() == params[i].param.size(), call,
                       name + ": " + std::to_string(grads[i].size()) + " elements for a parameter of " +
                           std::to_string(params[i].param.size()));
      all.push_back(params[i].param);
      all.push_back(grads[i]);
    }
    detail::check_disjoint(
        all, [](std::size_t k) { return (k % 2 == 0 ? "params[" : "grads[") + std::to_string(k / 2) + "]"; }, call);
    for (std::size_t i = 0; i < grads.size(); ++i) params[i].grad = grads[i];
  }

  StepScalars* device_scalars() const { return static_cast<StepScalars*>(scalars.data()); }

  Buffer fp32_state(std::size_t i, StreamView s) const {
    Buffer b(params[i].param.size(), DType::float32, device, MemoryKind::device, s);
    fill(b, 0.0, s);
    return b;
  }

  const float* found_inf_of(const LossScaler* scaler, StreamView s, const char* call) const {
    GPUCLOUD_EXPECTS(s.device() == device, call,
                     "stream: the parameters are on " + device.str() + ", the stream on " + s.device().str());
    if (scaler == nullptr) return nullptr;
    GPUCLOUD_EXPECTS(scaler->device() == device, call,
                     "scaler: its state is on " + scaler->device().str() + ", the parameters on " + device.str());
    return static_cast<const float*>(scaler->found_inf().data());
  }

  std::size_t step_count(StreamView s) const {
    Buffer host(sizeof(StepScalars), DType::uint8, Device::host(), MemoryKind::pinned);
    copy(host, scalars, s);
    s.synchronize();
    StepScalars v{};
    std::memcpy(&v, host.data(), sizeof v);
    return static_cast<std::size_t>(v.step);
  }

  void load_step_count(std::size_t steps, StreamView s) {
    GPUCLOUD_EXPECTS(s.device() == device, "load_step_count", "stream: on another device than the parameters");
    auto staging = std::make_shared<Buffer>(sizeof(StepScalars), DType::uint8, Device::host(), MemoryKind::pinned);
    GPUCLOUD_EXPECTS(steps <= static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()), "load_step_count",
                     "steps: " + std::to_string(steps) + " does not fit the int64 step count");
    const StepScalars v{static_cast<std::int64_t>(steps), 0.0f, 1.0f, 0.0f};
    std::memcpy(staging->data(), &v, sizeof v);
    copy(scalars, staging->view(), s);
    detail::hold_until_done(s, std::move(staging));
  }

  // "step" and, per parameter, each of @p per_param's buffers that exists, and the master.
  StateDict state_dict(const std::vector<std::pair<const char*, const std::vector<Buffer>*>>& per_param) const {
    StateDict out;
    out["step"] = TensorRef{BufferView(scalars.data(), 1, DType::int64, scalars.kind(), device), {}};
    auto add = [&](const char* suffix, const std::vector<Buffer>& v) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!v[i].empty()) out["state." + std::to_string(i) + "." + suffix] = TensorRef{v[i].view(), {}};
      }
    };
    for (const auto& [suffix, v] : per_param) add(suffix, *v);
    add("master", masters);
    return out;
  }

  // Checks @p state against @p expected, copies it in (skipping entries that are the state's own
  // memory), loads the step count and sets the parameters from their masters.
  void load_state_dict(const StateDict& expected, const StateDict& state, StreamView s, const char* call) {
    GPUCLOUD_EXPECTS(s.device() == device, call,
                     "stream: the state is on " + device.str() + ", the stream on " + s.device().str());
    detail::check_state_entries(expected, state, call);
    std::int64_t step = 0;
    detail::read_to_host(state.at("step").view, &step, sizeof step, s);
    GPUCLOUD_EXPECTS(step >= 0, call, "state['step']: " + std::to_string(step) + " is negative");
    for (const auto& [name, ref] : expected) {
      const BufferView src = state.at(name).view;
      if (name == "step" || src.data() == ref.view.data()) continue;
      copy(ref.view, src, s);
    }
    load_step_count(static_cast<std::size_t>(step), s);
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!masters[i].empty()) cast(params[i].param, masters[i], s);
    }
  }

  BufferView checked(const std::vector<Buffer>& v, std::size_t i, const char* call) const {
    GPUCLOUD_EXPECTS(i < params.size(), call,
                     "i: " + std::to_string(i) + " is not below " + std::to_string(params.size()));
    return v.empty() ? BufferView() : v[i].view();
  }
};

constexpr double kFloatMax = std::numeric_limits<float>::max();
}  // namespace

// ---- SGD ------------------------------------------------------------------------------------

struct FusedSGD::Impl {
  SgdOptions options;
  Common common;
  std::vector<Buffer> momentum;
};

namespace {
void check_options(const SgdOptions& o, const char* call) {
  detail::check_range(o.lr, 0.0, kFloatMax, false, call, "options.lr");
  detail::check_range(o.momentum, 0.0, kFloatMax, false, call, "options.momentum");
  detail::check_range(o.dampening, -kFloatMax, kFloatMax, false, call, "options.dampening");
  detail::check_range(o.weight_decay, 0.0, kFloatMax, false, call, "options.weight_decay");
  GPUCLOUD_EXPECTS(!o.nesterov || (o.momentum > 0.0f && o.dampening == 0.0f), call,
                   "options.nesterov: needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
}

void check_options(const AdamOptions& o, const char* call) {
  detail::check_range(o.lr, 0.0, kFloatMax, false, call, "options.lr");
  detail::check_range(o.beta1, 0.0, 1.0, false, call, "options.beta1");
  detail::check_range(o.beta2, 0.0, 1.0, false, call, "options.beta2");
  GPUCLOUD_EXPECTS(o.beta1 < 1.0f && o.beta2 < 1.0f, call, "options.beta1/beta2: must be below 1");
  detail::check_range(o.eps, 0.0, kFloatMax, false, call, "options.eps");
  detail::check_range(o.weight_decay, 0.0, kFloatMax, false, call, "options.weight_decay");
}
}  // namespace

FusedSGD::FusedSGD(std::vector<ParamGrad> params, SgdOptions o, StreamView stream) {
  check_options(o, "FusedSGD");
  auto impl = std::make_shared<Impl>();
  impl->options = o;
  impl->common.init(std::move(params), o.master_weights, stream, "FusedSGD");
  if (o.momentum != 0.0f) {
    for (std::size_t i = 0; i < impl->common.params.size(); ++i)
      impl->momentum.push_back(impl->common.fp32_state(i, stream));
  }
  impl_ = std::move(impl);
}

FusedSGD::~FusedSGD() = default;
FusedSGD::FusedSGD(FusedSGD&&) noexcept = default;
FusedSGD& FusedSGD::operator=(FusedSGD&&) noexcept = default;

int FusedSGD::step(StreamView stream, const LossScaler* scaler) {
  auto& c = impl_->common;
  const float* found_inf = c.found_inf_of(scaler, stream, "FusedSGD::step");
  const SgdOptions& o = impl_->options;
  detail::amp::begin_step(c.device_scalars(), found_inf, o.lr, 0.0, 0.0, stream);
  detail::amp::Rows4 rows;
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    rows.push_back({c.params[i].param, c.params[i].grad,
                    impl_->momentum.empty() ? BufferView() : impl_->momentum[i].view(), c.masters[i].view()});
  }
  const kernels::SgdOp op{found_inf,   c.device_scalars(), o.lr,       o.momentum,
                          o.dampening, o.weight_decay,     o.nesterov, o.maximize ? -1.0f : 1.0f};
  const int launches = 1 + detail::amp::sgd(rows, op, stream);
  detail::hold_until_done(stream, impl_, scaler != nullptr ? scaler->impl_ : nullptr);
  return launches;
}

void FusedSGD::set_lr(float lr) {
  detail::check_range(lr, 0.0, kFloatMax, false, "FusedSGD::set_lr", "lr");
  impl_->options.lr = lr;
}

void FusedSGD::set_options(const SgdOptions& o) {
  check_options(o, "FusedSGD::set_options");
  const SgdOptions& now = impl_->options;
  GPUCLOUD_EXPECTS((o.momentum != 0.0f) == (now.momentum != 0.0f), "FusedSGD::set_options",
                   "options.momentum: momentum cannot be switched on or off after construction (its buffers are "
                   "allocated then)");
  GPUCLOUD_EXPECTS(o.master_weights == now.master_weights, "FusedSGD::set_options",
                   "options.master_weights: fixed at construction");
  impl_->options = o;
}

void FusedSGD::set_grads(const std::vector<BufferView>& grads, StreamView stream) {
  impl_->common.set_grads(grads, stream, "FusedSGD::set_grads");
}

std::size_t FusedSGD::step_count(StreamView stream) const { return impl_->common.step_count(stream); }
void FusedSGD::load_step_count(std::size_t steps, StreamView stream) {
  impl_->common.load_step_count(steps, stream);
  detail::hold_until_done(stream, impl_);
}
StateDict FusedSGD::state_dict() const { return impl_->common.state_dict({{"momentum_buffer", &impl_->momentum}}); }
void FusedSGD::load_state_dict(const StateDict& state, StreamView stream) {
  impl_->common.load_state_dict(state_dict(), state, stream, "FusedSGD::load_state_dict");
  detail::hold_until_done(stream, impl_);
}
BufferView FusedSGD::momentum_buffer(std::size_t i) const {
  return impl_->common.checked(impl_->momentum, i, "FusedSGD::momentum_buffer");
}
BufferView FusedSGD::master(std::size_t i) const {
  return impl_->common.checked(impl_->common.masters, i, "FusedSGD::master");
}
const SgdOptions& FusedSGD::options() const { return impl_->options; }

// ---- Adam / AdamW ---------------------------------------------------------------------------

struct FusedAdam::Impl {
  AdamOptions options;
  Common common;
  std::vector<Buffer> exp_avg, exp_avg_sq, max_exp_avg_sq;
};

FusedAdam::FusedAdam(std::vector<ParamGrad> params, AdamOptions o, StreamView stream) {
  check_options(o, "FusedAdam");
  auto impl = std::make_shared<Impl>();
  impl->options = o;
  impl->common.init(std::move(params), o.master_weights, stream, "FusedAdam");
  for (std::size_t i = 0; i < impl->common.params.size(); ++i) {
    impl->exp_avg.push_back(impl->common.fp32_state(i, stream));
    impl->exp_avg_sq.push_back(impl->common.fp32_state(i, stream));
    if (o.amsgrad) impl->max_exp_avg_sq.push_back(impl->common.fp32_state(i, stream));
  }
  impl_ = std::move(impl);
}

FusedAdam::~FusedAdam() = default;
FusedAdam::FusedAdam(FusedAdam&&) noexcept = default;
FusedAdam& FusedAdam::operator=(FusedAdam&&) noexcept = default;

int FusedAdam::step(StreamView stream, const LossScaler* scaler) {
  auto& c = impl_->common;
  const float* found_inf = c.found_inf_of(scaler, stream, "FusedAdam::step");
  const AdamOptions& o = impl_->options;
  detail::amp::begin_step(c.device_scalars(), found_inf, o.lr, o.beta1, o.beta2, stream);
  detail::amp::Rows6 rows;
  for (std::size_t i = 0; i < c.params.size(); ++i) {
    rows.push_back({c.params[i].param, c.params[i].grad, impl_->exp_avg[i].view(), impl_->exp_avg_sq[i].view(),
                    o.amsgrad ? impl_->max_exp_avg_sq[i].view() : BufferView(), c.masters[i].view()});
  }
  const kernels::AdamOp op{found_inf,
                           c.device_scalars(),
                           o.lr,
                           o.beta1,
                           o.beta2,
                           o.eps,
                           o.weight_decay,
                           o.decoupled_weight_decay,
                           o.maximize ? -1.0f : 1.0f};
  const int launches = 1 + detail::amp::adam(rows, op, stream);
  detail::hold_until_done(stream, impl_, scaler != nullptr ? scaler->impl_ : nullptr);
  return launches;
}

void FusedAdam::set_lr(float lr) {
  detail::check_range(lr, 0.0, kFloatMax, false, "FusedAdam::set_lr", "lr");
  impl_->options.lr = lr;
}

void FusedAdam::set_options(const AdamOptions& o) {
  check_options(o, "FusedAdam::set_options");
  const AdamOptions& now = impl_->options;
  GPUCLOUD_EXPECTS(o.amsgrad == now.amsgrad, "FusedAdam::set_options",
                   "options.amsgrad: fixed at construction (its buffers are allocated then)");
  GPUCLOUD_EXPECTS(o.master_weights == now.master_weights, "FusedAdam::set_options",
                   "options.master_weights: fixed at construction");
  impl_->options = o;
}

void FusedAdam::set_grads(const std::vector<BufferView>& grads, StreamView stream) {
  impl_->common.set_grads(grads, stream, "FusedAdam::set_grads");
}

std::size_t FusedAdam::step_count(StreamView stream) const { return impl_->common.step_count(stream); }
void FusedAdam::load_step_count(std::size_t steps, StreamView stream) {
  impl_->common.load_step_count(steps, stream);
  detail::hold_until_done(stream, impl_);
}
StateDict FusedAdam::state_dict() const {
  return impl_->common.state_dict(
      {{"exp_avg", &impl_->exp_avg}, {"exp_avg_sq", &impl_->exp_avg_sq}, {"max_exp_avg_sq", &impl_->max_exp_avg_sq}});
}
void FusedAdam::load_state_dict(const StateDict& state, StreamView stream) {
  impl_->common.load_state_dict(state_dict(), state, stream, "FusedAdam::load_state_dict");
  detail::hold_until_done(stream, impl_);
}
BufferView FusedAdam::exp_avg(std::size_t i) const {
  return impl_->common.checked(impl_->exp_avg, i, "FusedAdam::exp_avg");
}
BufferView FusedAdam::exp_avg_sq(std::size_t i) const {
  return impl_->common.checked(impl_->exp_avg_sq, i, "FusedAdam::exp_avg_sq");
}
BufferView FusedAdam::max_exp_avg_sq(std::size_t i) const {
  return impl_->common.checked(impl_->max_exp_avg_sq, i, "FusedAdam::max_exp_avg_sq");
}
BufferView FusedAdam::master(std::size_t i) const {
  return impl_->common.checked(impl_->common.masters, i, "FusedAdam::master");
}
const AdamOptions& FusedAdam::options() const { return impl_->options; }

// ---- norms ----------------------------------------------------------------------------------

namespace {
// @p tensors as one multi-tensor list, each checked (before anything is allocated or enqueued).
detail::amp::Rows1 checked_rows(const std::vector<BufferView>& tensors, StreamView s, const char* call) {
  detail::amp::Rows1 rows;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::check_float_tensor(tensors[i], s, call, "tensors[" + std::to_string(i) + "]");
    rows.push_back({tensors[i]});
  }
  detail::check_disjoint(
      tensors, [](std::size_t i) { return "tensors[" + std::to_string(i) + "]"; }, call);
  return rows;
}

// Sum of squares of @p rows into partials, then norm (and the clip coefficient into @p coef) on
// the device.
Buffer norm_into(const detail::amp::Rows1& rows, float max_norm, StreamView s, float* coef) {
  const std::size_t count = detail::amp::partial_count(rows);
  const auto partials = detail::Workspace::floats(count, s);
  Buffer norm(1, DType::float32, s.device(), MemoryKind::device, s);
  detail::amp::sum_squares(rows, partials.as_floats(), s);
  detail::amp::finish_norm(partials.as_floats(), count, max_norm, norm.data_as<float>(), coef, s);
  return norm;
}
}  // namespace

Buffer global_norm(const std::vector<BufferView>& tensors, StreamView stream) {
  const detail::amp::Rows1 rows = checked_rows(tensors, stream, "global_norm");
  const auto coef = detail::Workspace::floats(1, stream);
  return norm_into(rows, 1.0f, stream, coef.as_floats());
}

Buffer clip_grad_norm(const std::vector<BufferView>& grads, float max_norm, StreamView stream) {
  detail::check_range(max_norm, 0.0, kFloatMax, true, "clip_grad_norm", "max_norm");
  const detail::amp::Rows1 rows = checked_rows(grads, stream, "clip_grad_norm");
  const auto coef = detail::Workspace::floats(1, stream);
  Buffer norm = norm_into(rows, max_norm, stream, coef.as_floats());
  detail::amp::scale_by(rows, coef.as_floats(), stream);
  return norm;
}

}  // namespace gpucloud
