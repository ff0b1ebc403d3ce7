// Loss scaling, fused optimizers and gradient clipping.
#include "interop.hpp"

#include <pybind11/stl.h>

#include <optional>
#include <tuple>

namespace gpucloud::python {

namespace {

// Parameters borrowed from Python objects; the owners stay alive as long as the optimizer.
struct BorrowedParams {
  std::vector<ParamGrad> params;
  std::vector<py::object> owners;       // the parameters'
  std::vector<py::object> grad_owners;  // the gradients'
};

BorrowedParams borrow_params(py::iterable pairs) {
  BorrowedParams out;
  std::size_t i = 0;
  for (auto item : pairs) {
    if (!py::isinstance<py::sequence>(item) || py::len(item) != 2) {
      throw py::type_error("params[" + std::to_string(i) + "]: expected a (param, grad) pair, got " + type_name(item));
    }
    auto pair = py::reinterpret_borrow<py::sequence>(item);
    const std::string p = "params[" + std::to_string(i) + "].param", g = "params[" + std::to_string(i) + "].grad";
    Borrowed param = borrow_writable(pair[0], p.c_str());
    Borrowed grad = borrow_writable(pair[1], g.c_str());
    out.params.push_back({param.view, grad.view});
    out.owners.push_back(param.owner);
    out.grad_owners.push_back(grad.owner);
    ++i;
  }
  return out;
}

std::vector<BufferView> borrow_list(py::iterable tensors, const char* name, std::vector<py::object>& owners) {
  std::vector<BufferView> out;
  std::size_t i = 0;
  for (auto t : tensors) {
    const std::string arg = std::string(name) + "[" + std::to_string(i++) + "]";
    Borrowed b = borrow_writable(t, arg.c_str());
    out.push_back(b.view);
    owners.push_back(b.owner);
  }
  return out;
}

template <class Optimizer>
struct PyOptimizer {
  std::unique_ptr<Optimizer> optimizer;
  std::vector<py::object> owners;       // the parameter arrays
  std::vector<py::object> grad_owners;  // the gradient arrays later steps read (set_grads replaces them)
  py::object stream;                    // the stream the state is ordered on must outlive it
  ~PyOptimizer() {
    py::gil_scoped_release release;
    optimizer.reset();
  }
};

// A View of state owned by @p owner (an optimizer or a scaler), whose exports wait for the work
// that initialised and updates it: @p stream, the stream the state is ordered on, and any work
// still queued that holds the owner.
py::object view_of_state(BufferView v, py::object owner, py::object stream) {
  return py::cast(PyView{v, {static_cast<std::int64_t>(v.size())}, std::move(owner), std::move(stream)});
}

// Keeps @p self (and the scaler, when given) alive until @p stream has run what was just enqueued.
void hold(py::object self, PyStream& stream, py::object scaler = py::none()) {
  std::vector<py::object> held{std::move(self)};
  if (!scaler.is_none()) held.push_back(std::move(scaler));
  keep_alive_until_done(stream.view, std::move(held));
}

// state_dict() / load_state_dict() of a Python holder (an optimizer's or the scaler's) whose C++
// object @p get returns: the state as views of its own memory (exports wait for its stream), and a
// restore in stream order that keeps the arrays and the holder until it has run.
template <class Holder, class Get>
void bind_state_dict(py::class_<Holder>& cls, Get get, const char* state_doc, const char* load_doc) {
  cls.def(
         "state_dict",
         [get](py::object self) {
           auto& h = self.cast<Holder&>();
           return state_to_python(get(h).state_dict(), self, h.stream);
         },
         state_doc)
      .def(
          "load_state_dict",
          [get](py::object self, TensorDict state, PyStream& stream) {
            std::vector<py::object> owners;
            const StateDict sd = state_from_python(state, owners);
            owners.push_back(self);
            enqueue_holding(stream.view, std::move(owners),
                            [&] { get(self.cast<Holder&>()).load_state_dict(sd, stream.view); });
          },
          py::arg("state"), py::arg("stream"), load_doc);
}

template <class Optimizer>
void bind_common(py::class_<PyOptimizer<Optimizer>>& cls) {
  using Py = PyOptimizer<Optimizer>;
  cls.def(
         "step",
         [](py::object self, PyStream& stream, PyScaler* scaler) {
           auto& o = self.cast<Py&>();
           const int launches = without_gil(
               [&] { return o.optimizer->step(stream.view, scaler != nullptr ? scaler->scaler.get() : nullptr); });
           // The step writes the parameters (held by self), reads these gradients (which a later
           // set_grads may drop from self) and the scaler's found-inf.
           hold(self, stream, scaler != nullptr ? py::cast(scaler, py::return_value_policy::reference) : py::none());
           keep_alive_until_done(stream.view, std::vector<py::object>(o.grad_owners));
           return launches;
         },
         py::arg("stream"), py::arg("scaler") = nullptr,
         "One fused step in stream order; skipped on the device when the scaler found an overflow. Returns the "
         "number of launches.")
      .def(
          "set_lr", [](Py& o, float lr) { o.optimizer->set_lr(lr); }, py::arg("lr"))
      .def(
          "set_grads",
          [](Py& o, py::iterable grads, PyStream& stream) {
            std::vector<py::object> owners;
            auto views = borrow_list(grads, "grads", owners);
            o.optimizer->set_grads(views, stream.view);
            o.grad_owners = std::move(owners);
          },
          py::arg("grads"), py::arg("stream"),
          "Replace the gradients later steps read (one per parameter, in order, same sizes): a framework's new "
          "gradient tensors.")
      .def_property_readonly("lr", [](Py& o) { return o.optimizer->options().lr; })
      .def(
          "step_count",
          [](Py& o, PyStream& stream) { return without_gil([&] { return o.optimizer->step_count(stream.view); }); },
          py::arg("stream"), "Completed (not skipped) steps; synchronises the stream.")
      .def(
          "load_step_count",
          [](py::object self, std::size_t steps, PyStream& stream) {
            enqueue_holding(stream.view, {self},
                            [&] { self.cast<Py&>().optimizer->load_step_count(steps, stream.view); });
          },
          py::arg("steps"), py::arg("stream"), "Set the step count (restoring a checkpoint), in stream order.")
      .def(
          "master",
          [](py::object self, std::size_t i) {
            auto& o = self.cast<Py&>();
            return view_of_state(o.optimizer->master(i), self, o.stream);
          },
          py::arg("i"), "fp32 master of parameter i (empty for fp32 parameters).");
  bind_state_dict(
      cls, [](Py& o) -> Optimizer& { return *o.optimizer; },
      "The state as {name: BufferView} of its own memory (no copies): 'step' and 'state.<i>.<buffer>'.",
      "Restore {name: array} named as state_dict() (its own views, filled by checkpoint.load, or any "
      "arrays); each parameter is then set from its master. Synchronises the stream (it reads the step "
      "count).");
}

}  // namespace

void bind_amp(py::module_& m) {
  py::class_<LossScalerOptions>(m, "LossScalerOptions", "The scaler's settings; defaults are PyTorch GradScaler's.")
      .def(py::init<>())
      .def_readwrite("init_scale", &LossScalerOptions::init_scale)
      .def_readwrite("growth_factor", &LossScalerOptions::growth_factor)
      .def_readwrite("backoff_factor", &LossScalerOptions::backoff_factor)
      .def_readwrite("growth_interval", &LossScalerOptions::growth_interval)
      .def_readwrite("hysteresis", &LossScalerOptions::hysteresis)
      .def_readwrite("min_scale", &LossScalerOptions::min_scale)
      .def_readwrite("dynamic", &LossScalerOptions::dynamic);
  py::class_<LossScalerState>(m, "LossScalerState", "The scaler's state as the host sees it.")
      .def(py::init<>())
      .def(py::init([](float scale, std::int32_t growth_tracker, std::int32_t hysteresis_left, bool found_inf) {
             return LossScalerState{scale, growth_tracker, hysteresis_left, found_inf};
           }),
           py::arg("scale"), py::arg("growth_tracker") = 0, py::arg("hysteresis_left") = 1,
           py::arg("found_inf") = false)
      .def_readwrite("scale", &LossScalerState::scale)
      .def_readwrite("growth_tracker", &LossScalerState::growth_tracker)
      .def_readwrite("hysteresis_left", &LossScalerState::hysteresis_left)
      .def_readwrite("found_inf", &LossScalerState::found_inf);

  py::class_<PyScaler> scaler_class(m, "LossScaler", "Dynamic (or static) loss scaling with its state on the device.");
  scaler_class
      .def(py::init([](DeviceLike device, StreamArg stream, float init_scale, double growth_factor,
                       double backoff_factor, int growth_interval, int hysteresis, float min_scale, bool dynamic) {
             LossScalerOptions o{init_scale, growth_factor, backoff_factor, growth_interval,
                                 hysteresis, min_scale,     dynamic};
             auto p = std::make_unique<PyScaler>();
             p->scaler = std::make_unique<LossScaler>(to_device(device), stream.cast<PyStream&>().view, o);
             p->stream = stream;
             return p;
           }),
           py::arg("device"), py::arg("stream"), py::kw_only(), py::arg("init_scale") = LossScalerOptions{}.init_scale,
           py::arg("growth_factor") = LossScalerOptions{}.growth_factor,
           py::arg("backoff_factor") = LossScalerOptions{}.backoff_factor,
           py::arg("growth_interval") = LossScalerOptions{}.growth_interval,
           py::arg("hysteresis") = LossScalerOptions{}.hysteresis, py::arg("min_scale") = LossScalerOptions{}.min_scale,
           py::arg("dynamic") = true)
      .def(
          "scale",
          [](py::object self, ArrayLike values, PyStream& stream) {
            auto& s = self.cast<PyScaler&>();
            Borrowed b = borrow_writable(values, "values");
            enqueue_holding(stream.view, {b.owner, self}, [&] { s.scaler->scale(b.view, stream.view); });
          },
          py::arg("values"), py::arg("stream"), "values *= scale in place (the loss before backward).")
      .def(
          "unscale",
          [](py::object self, py::iterable grads, PyStream& stream) {
            auto& s = self.cast<PyScaler&>();
            std::vector<py::object> owners;
            auto views = borrow_list(grads, "grads", owners);
            owners.push_back(self);
            return enqueue_holding(stream.view, std::move(owners),
                                   [&] { return s.scaler->unscale(views, stream.view); });
          },
          py::arg("grads"), py::arg("stream"),
          "One fused pass: g /= scale in place, found_inf set on inf/NaN. Returns the number of launches.")
      .def(
          "update",
          [](py::object self, PyStream& stream) {
            enqueue_holding(stream.view, {self}, [&] { self.cast<PyScaler&>().scaler->update(stream.view); });
          },
          py::arg("stream"), "Apply the update rule and clear found_inf (end of every step).")
      .def(
          "state",
          [](PyScaler& s, PyStream& stream) { return without_gil([&] { return s.scaler->state(stream.view); }); },
          py::arg("stream"), "Read the state (synchronises the stream).")
      .def(
          "load_state",
          [](py::object self, const LossScalerState& state, PyStream& stream) {
            enqueue_holding(stream.view, {self},
                            [&] { self.cast<PyScaler&>().scaler->load_state(state, stream.view); });
          },
          py::arg("state"), py::arg("stream"), "Restore a state (a checkpoint's) in stream order.")
      .def_property_readonly("found_inf",
                             [](py::object self) {
                               auto& s = self.cast<PyScaler&>();
                               return view_of_state(s.scaler->found_inf(), self, s.stream);
                             })
      .def_property_readonly("scale_value",
                             [](py::object self) {
                               auto& s = self.cast<PyScaler&>();
                               return view_of_state(s.scaler->scale_value(), self, s.stream);
                             })
      .def_property_readonly("options", [](PyScaler& s) { return s.scaler->options(); });
  bind_state_dict(
      scaler_class, [](PyScaler& s) -> LossScaler& { return *s.scaler; },
      "The state as {name: BufferView} of its device memory: scale, growth_tracker, hysteresis_left.",
      "Restore {name: array} named as state_dict() (validated as load_state); synchronises the stream.");

  using PySgd = PyOptimizer<FusedSGD>;
  py::class_<PySgd> sgd(m, "FusedSGD", "Fused multi-tensor SGD (torch.optim.SGD's math), fp32 masters for fp16/bf16.");
  sgd.def(py::init([](py::iterable params, StreamArg stream, float lr, float momentum, float dampening,
                      float weight_decay, bool nesterov, bool master_weights, bool maximize) {
            auto b = borrow_params(params);
            auto p = std::make_unique<PySgd>();
            SgdOptions o{lr, momentum, dampening, weight_decay, nesterov, master_weights, maximize};
            p->optimizer = std::make_unique<FusedSGD>(b.params, o, stream.cast<PyStream&>().view);
            p->owners = std::move(b.owners);
            p->grad_owners = std::move(b.grad_owners);
            p->stream = stream;
            return p;
          }),
          py::arg("params"), py::arg("stream"), py::kw_only(), py::arg("lr") = SgdOptions{}.lr,
          py::arg("momentum") = 0.0f, py::arg("dampening") = 0.0f, py::arg("weight_decay") = 0.0f,
          py::arg("nesterov") = false, py::arg("master_weights") = true, py::arg("maximize") = false,
          "maximize=True ascends (the gradient negated first, torch's maximize).")
      .def(
          "momentum_buffer",
          [](py::object self, std::size_t i) {
            auto& o = self.cast<PySgd&>();
            return view_of_state(o.optimizer->momentum_buffer(i), self, o.stream);
          },
          py::arg("i"))
      .def(
          "set_options",
          [](PySgd& o, std::optional<float> lr, std::optional<float> momentum, std::optional<float> dampening,
             std::optional<float> weight_decay, std::optional<bool> nesterov, std::optional<bool> maximize) {
            SgdOptions n = o.optimizer->options();
            n.lr = lr.value_or(n.lr);
            n.momentum = momentum.value_or(n.momentum);
            n.dampening = dampening.value_or(n.dampening);
            n.weight_decay = weight_decay.value_or(n.weight_decay);
            n.nesterov = nesterov.value_or(n.nesterov);
            n.maximize = maximize.value_or(n.maximize);
            o.optimizer->set_options(n);
          },
          py::kw_only(), py::arg("lr") = py::none(), py::arg("momentum") = py::none(),
          py::arg("dampening") = py::none(), py::arg("weight_decay") = py::none(), py::arg("nesterov") = py::none(),
          py::arg("maximize") = py::none(),
          "Change hyperparameters for later steps (None: unchanged); momentum cannot be switched on or off.");
  bind_common(sgd);

  using PyAdam = PyOptimizer<FusedAdam>;
  py::class_<PyAdam> adam(m, "FusedAdam", "Fused multi-tensor Adam / AdamW (torch.optim's math), amsgrad optional.");
  adam.def(py::init([](py::iterable params, StreamArg stream, float lr, std::pair<float, float> betas, float eps,
                       float weight_decay, bool amsgrad, bool decoupled_weight_decay, bool master_weights,
                       bool maximize) {
             auto b = borrow_params(params);
             auto p = std::make_unique<PyAdam>();
             AdamOptions o{lr,           betas.first, betas.second,           eps,
                           weight_decay, amsgrad,     decoupled_weight_decay, master_weights,
                           maximize};
             p->optimizer = std::make_unique<FusedAdam>(b.params, o, stream.cast<PyStream&>().view);
             p->owners = std::move(b.owners);
             p->grad_owners = std::move(b.grad_owners);
             p->stream = stream;
             return p;
           }),
           py::arg("params"), py::arg("stream"), py::kw_only(), py::arg("lr") = AdamOptions{}.lr,
           py::arg("betas") = std::make_pair(0.9f, 0.999f), py::arg("eps") = AdamOptions{}.eps,
           py::arg("weight_decay") = 0.0f, py::arg("amsgrad") = false, py::arg("decoupled_weight_decay") = false,
           py::arg("master_weights") = true, py::arg("maximize") = false,
           "decoupled_weight_decay=True is AdamW; maximize=True ascends (the gradient negated first).")
      .def(
          "exp_avg",
          [](py::object self, std::size_t i) {
            auto& o = self.cast<PyAdam&>();
            return view_of_state(o.optimizer->exp_avg(i), self, o.stream);
          },
          py::arg("i"))
      .def(
          "exp_avg_sq",
          [](py::object self, std::size_t i) {
            auto& o = self.cast<PyAdam&>();
            return view_of_state(o.optimizer->exp_avg_sq(i), self, o.stream);
          },
          py::arg("i"))
      .def(
          "max_exp_avg_sq",
          [](py::object self, std::size_t i) {
            auto& o = self.cast<PyAdam&>();
            return view_of_state(o.optimizer->max_exp_avg_sq(i), self, o.stream);
          },
          py::arg("i"))
      .def(
          "set_options",
          [](PyAdam& o, std::optional<float> lr, std::optional<std::pair<float, float>> betas, std::optional<float> eps,
             std::optional<float> weight_decay, std::optional<bool> decoupled_weight_decay,
             std::optional<bool> maximize) {
            AdamOptions n = o.optimizer->options();
            n.maximize = maximize.value_or(n.maximize);
            n.lr = lr.value_or(n.lr);
            if (betas) std::tie(n.beta1, n.beta2) = *betas;
            n.eps = eps.value_or(n.eps);
            n.weight_decay = weight_decay.value_or(n.weight_decay);
            n.decoupled_weight_decay = decoupled_weight_decay.value_or(n.decoupled_weight_decay);
            o.optimizer->set_options(n);
          },
          py::kw_only(), py::arg("lr") = py::none(), py::arg("betas") = py::none(), py::arg("eps") = py::none(),
          py::arg("weight_decay") = py::none(), py::arg("decoupled_weight_decay") = py::none(),
          py::arg("maximize") = py::none(),
          "Change hyperparameters for later steps (None: unchanged); amsgrad and master weights are fixed.");
  bind_common(adam);

  m.def(
      "clip_grad_norm",
      [](py::iterable grads, float max_norm, PyStream& stream) {
        std::vector<py::object> owners;
        auto views = borrow_list(grads, "grads", owners);
        Buffer norm = enqueue_holding(stream.view, std::move(owners),
                                      [&] { return clip_grad_norm(views, max_norm, stream.view); });
        // The norm is freed in the stream's order: it holds the stream.
        return std::make_unique<PyBuffer>(std::move(norm), std::vector<std::int64_t>{1}, py::none(),
                                          py::cast(&stream, py::return_value_policy::reference));
      },
      py::arg("grads"), py::arg("max_norm"), py::arg("stream"),
      "Scale grads so their global L2 norm is at most max_norm; returns the norm before clipping (a 1-element "
      "Buffer on the device, in stream order).");
  m.def(
      "global_norm",
      [](py::iterable tensors, PyStream& stream) {
        std::vector<py::object> owners;
        auto views = borrow_list(tensors, "tensors", owners);
        Buffer norm = enqueue_holding(stream.view, std::move(owners), [&] { return global_norm(views, stream.view); });
        return std::make_unique<PyBuffer>(std::move(norm), std::vector<std::int64_t>{1}, py::none(),
                                          py::cast(&stream, py::return_value_policy::reference));
      },
      py::arg("tensors"), py::arg("stream"), "The global L2 norm (a 1-element Buffer on the device).");
}

}  // namespace gpucloud::python
