"""torch.optim drop-ins over gpucloud's fused multi-tensor kernels: ``AdamW``, ``Adam``, ``SGD``.

Real ``torch.optim.Optimizer`` subclasses: ``param_groups`` with per-group hyperparameters,
``add_param_group``, ``zero_grad(set_to_none=...)``, ``torch.optim.lr_scheduler`` unchanged,
``step(closure)``, and ``state_dict()`` / ``load_state_dict()`` in torch's own format (a state dict
of ``torch.optim.AdamW`` loads into ``gpucloud.torch.optim.AdamW`` and the reverse). The state
tensors in ``optimizer.state[p]`` are views of the fused optimizer's memory (no copies).

A group's parameters are stepped by fused optimizers over "cohorts": parameters that have always
stepped together, so they share one step count. Usually that is the whole group, built at its first
step over the parameters with a gradient. As torch does, a parameter without a gradient is skipped
(its state and step count kept), one whose gradient appears later starts its own state then, and a
parameter whose ``.data`` was replaced is followed (its state kept). Gradients are bound at every
step, so ``zero_grad(set_to_none=True)`` and new gradient tensors just work. Under
``gpucloud.torch.GradScaler`` the step is skipped on the device after an overflow (no host sync).

The fused kernels step float32, float16 and bfloat16 parameters (in fp32 math). Parameters of the
other dtypes torch's optimizers take (float64, complex) step with torch's own optimizer of the same
name, in the same group and the same state dict, so every parameter torch steps is stepped as
torch does. ``SGD`` takes sparse gradients (as torch's: rows without a gradient do not move);
``Adam``/``AdamW`` refuse them by name, as torch's do.
"""
import torch

import gpucloud as _gc

from ._streams import finish, stream_for

__all__ = ["Adam", "AdamW", "SGD"]

# The parameter dtypes the fused kernels step; the others step with torch's own optimizer.
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# torch's optimizer flags that the fused kernels follow only in their default setting.
_TORCH_FLAGS = {"maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None}


# Which implementation torch picks (its for-loop, foreach or fused kernels): any setting gives the
# same update, and gpucloud's kernels are fused multi-tensor ones whatever it says. maximize is
# followed by the kernels (the gradient negated first).
_IMPLEMENTATION_FLAGS = ("foreach", "fused")
_FOLLOWED_FLAGS = ("maximize",)


def _check_flags(where, flags):
    """torch's flags at a setting the fused kernels follow; anything else is refused by name."""
    for k, v in flags.items():
        if k in _IMPLEMENTATION_FLAGS:
            if v not in (None, True, False):
                raise TypeError(f"{where}{k}: expected None or a bool, got {v!r}")
        elif k in _FOLLOWED_FLAGS:
            if not isinstance(v, bool):
                raise TypeError(f"{where}{k}: expected a bool, got {v!r}")
        elif v not in (_TORCH_FLAGS[k], None):
            raise _gc.Unsupported(f"{where}{k}={v!r}: the fused kernels run only with {k}={_TORCH_FLAGS[k]!r}")


class _Cohort:
    """Parameters of one group that have always stepped together, and their fused optimizer."""

    __slots__ = ("fused", "members", "stream", "ptrs", "bound", "shadows")

    def __init__(self, fused, members, stream, shadows):
        self.fused, self.members, self.stream = fused, members, stream
        self.ptrs = [p.data_ptr() for p in members]  # the tensors the step updates
        self.bound = None  # (the gradients set_grads bound, their data pointers)
        self.shadows = shadows  # [(parameter, contiguous copy the fused optimizer updates)]: non-contiguous ones


class _FusedOptimizer(torch.optim.Optimizer):
    """What the drop-ins share: fused gpucloud optimizers over each group's cohorts."""

    _state_keys = ()  # the per-parameter state tensors, as torch names them
    _torch_name = ""  # torch's optimizer of the same math: it steps the dtypes the kernels do not
    _sparse_grads = False  # whether torch's takes sparse gradients
    _gpucloud_fused = True  # GradScaler.step lets the step skip itself on the device

    def __init__(self, params, defaults, master_weights, flags):
        if not isinstance(master_weights, bool):
            raise TypeError(f"master_weights: expected a bool, got {type(master_weights).__name__}")
        _check_flags(f"{type(self).__name__}: ", flags)
        self._master_weights = master_weights
        self._cohorts = {}  # group index -> [_Cohort]
        self._plain = {}  # group index -> torch's optimizer over the group's parameters of other dtypes
        super().__init__(params, dict(defaults, **flags))

    # -- what each optimizer says ------------------------------------------------------------
    def _make(self, pairs, stream, group):  # pragma: no cover - abstract
        raise NotImplementedError

    def _options(self, group):  # pragma: no cover - abstract
        raise NotImplementedError

    def _views(self, fused, i, p):  # pragma: no cover - abstract
        raise NotImplementedError

    # -- torch.optim.Optimizer ---------------------------------------------------------------
    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            for k, v in _TORCH_FLAGS.items():
                group.setdefault(k, v)

    @torch.no_grad()
    def step(self, closure=None):
        """One step over every group (``closure`` re-evaluates the loss, as torch's)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        scaler = getattr(self, "_gpucloud_scaler", None)  # set by GradScaler.step for this call
        for gi, group in enumerate(self.param_groups):
            self._check_group(gi, group)
            grads, plain = {}, False
            for i, p in enumerate(group["params"]):
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse:
                    if not self._sparse_grads:
                        raise _gc.InvalidArgument(f"{type(self).__name__}.step: param_groups[{gi}]['params'][{i}]: "
                                                  f"a sparse gradient: torch's {self._torch_name} does not take them "
                                                  "either (torch.optim.SparseAdam does)")
                    if p.dtype in _FUSED_DTYPES:
                        g = g.to_dense()  # the same update: rows without a gradient add zeros
                fused = p.dtype in _FUSED_DTYPES
                self._check_path(gi, i, p, fused)
                if not fused:
                    plain = True
                    continue
                grads[p] = g if g.is_contiguous() else g.contiguous()
            if plain and not (scaler is not None and scaler._found_inf()):
                self._plain_step(gi, group)
            if not grads:
                continue
            options = self._options(group)
            for cohort in self._stepping(gi, group, grads):
                self._bind_grads(cohort, [grads[p] for p in cohort.members])
                cohort.fused.set_options(**options)
                for p, shadow in cohort.shadows:  # the step runs on contiguous copies, in stream order
                    shadow.copy_(p)
                cohort.fused.step(cohort.stream, scaler.loss_scaler if scaler is not None else None)
                finish(cohort.stream, cohort.members[0].device)
                for p, shadow in cohort.shadows:
                    p.copy_(shadow)
        return loss

    def add_param_group(self, param_group):
        """torch's; a parameter that is neither floating-point nor complex is refused by name."""
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        for i, p in enumerate(self.param_groups[gi]["params"]):
            if not (p.is_floating_point() or p.is_complex()):
                raise _gc.InvalidArgument(f"{type(self).__name__}: param_groups[{gi}]['params'][{i}]: {p.dtype}: "
                                          "an optimizer steps floating-point or complex parameters")

    def _check_path(self, gi, i, p, fused):
        """A parameter stays with the implementation that holds its state (its ``.data`` may not move
        between the kernels' dtypes and torch's)."""
        if fused:
            inner = self._plain.get(gi)
            held = inner is not None and any(q is p for q in inner.param_groups[0]["params"])
        else:
            held = any(q is p for c in self._cohorts.get(gi, ()) for q in c.members)
        if held:
            raise _gc.Unsupported(f"{type(self).__name__}: param_groups[{gi}]['params'][{i}]: {p.dtype}: its .data "
                                  "changed dtype; its state (kept by the fused kernels for float32, float16 and "
                                  "bfloat16, by torch's optimizer for the others) cannot follow it")

    def _plain_step(self, gi, group):
        """Steps the group's parameters of the dtypes the kernels do not step with torch's own
        optimizer (made over them once, their state shared with ``self.state``)."""
        members = [p for p in group["params"] if p.dtype not in _FUSED_DTYPES]
        settings = {k: group[k] for k in self.defaults if k not in _TORCH_FLAGS or k in _FOLLOWED_FLAGS}
        inner = self._plain.get(gi)
        if inner is None or len(inner.param_groups[0]["params"]) != len(members) or any(
                a is not b for a, b in zip(inner.param_groups[0]["params"], members)):
            inner = self._plain[gi] = getattr(torch.optim, self._torch_name)(members, **settings)
            for p in members:
                if p in self.state:
                    inner.state[p] = self.state[p]
        inner.param_groups[0].update(settings)
        inner.step()
        for p in members:
            if p in inner.state:
                self.state[p] = inner.state[p]

    def _stepping(self, gi, group, grads):
        """The cohorts of group ``gi`` that step now (every member has a gradient in ``grads``):
        a cohort only part of which has one is split (both parts keep their state and step count),
        one whose members' ``.data`` changed is rebuilt over the new tensors, and parameters with a
        gradient and no cohort yet start one."""
        cohorts = self._cohorts.setdefault(gi, [])
        placed, stepping = set(), []
        for ci in range(len(cohorts)):
            cohort = cohorts[ci]
            placed.update(cohort.members)
            present = [p for p in cohort.members if p in grads]
            if not present:
                continue
            if len(present) < len(cohort.members):
                absent = [p for p in cohort.members if p not in grads]
                cohorts.append(self._rebuild(gi, group, cohort, absent))
                cohort = cohorts[ci] = self._rebuild(gi, group, cohort, present)
            elif [p.data_ptr() for p in cohort.members] != cohort.ptrs:
                cohort = cohorts[ci] = self._rebuild(gi, group, cohort, cohort.members)
            stepping.append(cohort)
        new = [p for p in group["params"] if p in grads and p not in placed]
        if new:
            cohorts.append(self._new_cohort(gi, group, new))
            stepping.append(cohorts[-1])
        return stepping

    def _bind_grads(self, cohort, grads):
        """set_grads, unless the cohort's gradients are the tensors (and memory) bound last step:
        the fused optimizer holds them, so the same objects with the same data pointers are its
        bindings (set_grads' checks and DLPack exports cost ~6 us a tensor)."""
        ptrs = [g.data_ptr() for g in grads]
        bound = cohort.bound
        if bound is not None and bound[1] == ptrs and all(a is b for a, b in zip(bound[0], grads)):
            return
        cohort.fused.set_grads(grads, cohort.stream)
        cohort.bound = (grads, ptrs)

    def state_dict(self):
        """torch's format; each parameter's ``step`` is read from the device (a sync on a GPU)."""
        for cohorts in self._cohorts.values():
            for cohort in cohorts:
                steps = float(cohort.fused.step_count(cohort.stream))
                for p in cohort.members:
                    if "step" in self.state[p]:
                        self.state[p]["step"] = torch.tensor(steps)
        ordered = type(self.state)()  # in the parameters' order, as torch's (cohorts form in any)
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    ordered[p] = self.state[p]
        self.state = ordered
        return super().state_dict()

    def load_state_dict(self, state_dict):
        """Loads torch's format (from this class or torch's own); a foreign state is an error naming the key."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise _gc.InvalidArgument(f"{type(self).__name__}.load_state_dict: state_dict: expected an optimizer "
                                      "state dict with 'state' and 'param_groups'")
        self._validate(state_dict)  # before anything changes
        super().load_state_dict(state_dict)  # torch's id mapping and casts; self.state now holds copies
        loaded, self._cohorts, self._plain = self.state, {}, {}
        self.state = type(loaded)()
        with torch.no_grad():
            for gi, group in enumerate(self.param_groups):
                by_step = {}  # parameters at the same step form a cohort
                for p in group["params"]:
                    if p in loaded and loaded[p] and p.dtype not in _FUSED_DTYPES:
                        self.state[p] = loaded[p]  # torch's optimizer takes it at the next step
                    elif p in loaded and loaded[p]:
                        by_step.setdefault(_step_of(loaded[p]), []).append(p)
                self._cohorts[gi] = [self._new_cohort(gi, group, members, loaded) for members in by_step.values()]

    # -- internals ---------------------------------------------------------------------------
    def _required(self, group):
        """The state tensors a parameter of ``group`` must have once it has stepped."""
        return self._state_keys

    def _validate(self, state_dict):
        name = f"{type(self).__name__}.load_state_dict"
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)}, this optimizer has {len(self.param_groups)})")
        for gi, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            for key in self.defaults:
                if key not in saved and key not in _TORCH_FLAGS:
                    raise _gc.InvalidArgument(f"{name}: param_groups[{gi}]['{key}']: missing; the state dict is not "
                                              f"of a {type(self).__name__}")
            if len(saved.get("params", ())) != len(group["params"]):
                raise ValueError(f"{name}: loaded state dict contains a parameter group that doesn't match the size "
                                 f"of optimizer's group (param_groups[{gi}])")
            for pid, p in zip(saved["params"], group["params"]):
                entry = saved_state.get(pid)
                if not entry:
                    continue
                for key in self._required(saved):
                    value = entry.get(key)
                    if not isinstance(value, torch.Tensor):
                        raise _gc.InvalidArgument(f"{name}: state[{pid}]['{key}']: missing (got "
                                                  f"{type(value).__name__}); the state dict is not of this optimizer")
                    if value.numel() != p.numel():
                        raise _gc.InvalidArgument(f"{name}: state[{pid}]['{key}']: {value.numel()} elements for a "
                                                  f"parameter of {p.numel()}")

    def _check_group(self, gi, group):
        _check_flags(f"{type(self).__name__}: param_groups[{gi}]: ", {k: group.get(k, v) for k, v in _TORCH_FLAGS.items()})

    def _new_cohort(self, gi, group, members, loaded=None):
        """A fused optimizer over ``members``: fresh state, or ``loaded``'s (torch's format, by parameter)."""
        device = members[0].device
        where = f"{type(self).__name__}: param_groups[{gi}]['params']"
        index = {id(p): i for i, p in enumerate(group["params"])}
        for p in members:
            if p.device != device:
                raise _gc.InvalidArgument(f"{where}[{index[id(p)]}] is on {p.device}, another of the group on "
                                          f"{device}: one device per group")
            if loaded is not None:
                for key in self._state_keys:
                    t = loaded[p].get(key)
                    if isinstance(t, torch.Tensor) and t.numel() != p.numel():
                        raise _gc.InvalidArgument(f"{where}[{index[id(p)]}]: {p.numel()} elements, its state "
                                                  f"'{key}' {t.numel()}: a parameter's .data may change, not its size")
        stream = stream_for(device)
        grads = [p.grad.contiguous() if loaded is None and p.grad is not None and p.grad.layout == torch.strided
                 else torch.zeros_like(p, memory_format=torch.contiguous_format) for p in members]
        shadows = [(p, p.detach().contiguous()) for p in members if not p.is_contiguous()]
        updated = {id(p): shadow for p, shadow in shadows}
        fused = self._make(list(zip([updated.get(id(p), p.detach()) for p in members], grads)), stream, group)
        if loaded is not None:
            fused.load_state_dict(self._fused_state(gi, members, loaded, fused), stream)
        for i, p in enumerate(members):
            self.state[p] = self._views(fused, i, p)
        finish(stream, device)
        return _Cohort(fused, list(members), stream, shadows)

    def _rebuild(self, gi, group, cohort, members):
        """A new cohort over ``members`` (all of ``cohort``) with their state and step count: a
        split, or parameters whose ``.data`` is another tensor now (their masters start from it)."""
        steps = float(cohort.fused.step_count(cohort.stream))
        loaded, wanted = {}, {id(p) for p in members}
        for p, ptr in zip(cohort.members, cohort.ptrs):
            if id(p) in wanted:
                state = dict(self.state[p], step=torch.tensor(steps))
                if p.data_ptr() != ptr:
                    state.pop("master", None)
                loaded[p] = state
        return self._new_cohort(gi, group, members, loaded)

    def _fused_state(self, gi, members, loaded, fused):
        """{name: tensor} as the fused optimizer's load_state_dict wants, from torch-format state."""
        name = type(self).__name__
        steps = {_step_of(loaded[p]) for p in members}
        if len(steps) != 1:  # pragma: no cover - cohorts are made of equal steps
            raise _gc.InvalidArgument(f"{name}.load_state_dict: param_groups[{gi}]: the parameters' 'step' differ "
                                      f"({sorted(steps)})")
        out = {"step": torch.tensor([int(steps.pop())], dtype=torch.int64)}
        wanted = set(fused.state_dict())
        for i, p in enumerate(members):
            for key in self._state_keys:
                entry = f"state.{i}.{key}"
                if entry not in wanted:
                    continue
                # present and of the parameter's size: _validate checked it before anything changed
                out[entry] = loaded[p][key].detach().to(torch.float32).contiguous().reshape(-1)
            if f"state.{i}.master" in wanted:
                master = loaded[p].get("master")
                out[f"state.{i}.master"] = (master if isinstance(master, torch.Tensor) else p.detach()).to(
                    torch.float32).contiguous().reshape(-1)
        return out


def _step_of(state):
    """A parameter's step count in torch's format (SGD keeps none: 1 once it has a momentum buffer)."""
    if "step" in state:
        return float(state["step"])
    return 1.0 if state.get("momentum_buffer") is not None else 0.0


def _view(v, like):
    """A torch tensor sharing the memory of gpucloud state ``v``, shaped as ``like``."""
    return torch.from_dlpack(v).view(like.shape)


class Adam(_FusedOptimizer):
    """``torch.optim.Adam`` over gpucloud's fused Adam kernel (``weight_decay`` is an L2 penalty)."""

    _decoupled = False
    _state_keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    _torch_name = "Adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 master_weights=False):
        flags = dict(foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                     fused=fused)
        name = type(self).__name__
        if not 0.0 <= lr:
            raise ValueError(f"{name}: lr: {lr} is negative")
        if not 0.0 <= eps:
            raise ValueError(f"{name}: eps: {eps} is negative")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"{name}: betas: {betas} are not in [0, 1)")
        if not 0.0 <= weight_decay:
            raise ValueError(f"{name}: weight_decay: {weight_decay} is negative")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults, master_weights, flags)

    def _required(self, group):
        return ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group.get("amsgrad") else ("exp_avg", "exp_avg_sq")

    def _make(self, pairs, stream, group):
        return _gc.FusedAdam(pairs, stream, lr=group["lr"], betas=tuple(group["betas"]), eps=group["eps"],
                             weight_decay=group["weight_decay"], amsgrad=bool(group["amsgrad"]),
                             decoupled_weight_decay=self._decoupled, master_weights=self._master_weights,
                             maximize=bool(group.get("maximize")))

    def _options(self, group):
        return dict(lr=float(group["lr"]), betas=tuple(float(b) for b in group["betas"]), eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]), maximize=bool(group.get("maximize")))

    def _views(self, fused, i, p):
        state = {"step": torch.tensor(0.0), "exp_avg": _view(fused.exp_avg(i), p),
                 "exp_avg_sq": _view(fused.exp_avg_sq(i), p)}
        ams = fused.max_exp_avg_sq(i)
        if len(ams):
            state["max_exp_avg_sq"] = _view(ams, p)
        return _with_master(state, fused, i, p, self._master_weights)


_SGD_EMPTY_STATE = []


def _torch_sgd_keeps_empty_state():
    """Whether the installed torch's SGD keeps a state entry (``momentum_buffer`` None) for a
    parameter stepped without momentum: 1.13 does, torch 2 does not. Asked of torch once."""
    if not _SGD_EMPTY_STATE:
        p = torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.zeros(1)
        opt = torch.optim.SGD([p], lr=0.1)
        opt.step()
        _SGD_EMPTY_STATE.append(bool(opt.state_dict()["state"]))
    return _SGD_EMPTY_STATE[0]


def _with_master(state, fused, i, p, master_weights):
    master = fused.master(i)
    if master_weights and len(master):
        state["master"] = _view(master, p)
    return state


class AdamW(Adam):
    """``torch.optim.AdamW`` over gpucloud's fused Adam kernel (decoupled weight decay, default 0.01)."""

    _decoupled = True
    _torch_name = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 master_weights=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, master_weights=master_weights)


class SGD(_FusedOptimizer):
    """``torch.optim.SGD`` over gpucloud's fused SGD kernel (momentum, dampening, Nesterov, weight decay)."""

    _state_keys = ("momentum_buffer",)
    _torch_name = "SGD"
    _sparse_grads = True

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 master_weights=False):
        flags = dict(foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                     fused=fused)
        name = type(self).__name__
        if not 0.0 <= lr:
            raise ValueError(f"{name}: lr: {lr} is negative")
        if not 0.0 <= momentum:
            raise ValueError(f"{name}: momentum: {momentum} is negative")
        if not 0.0 <= weight_decay:
            raise ValueError(f"{name}: weight_decay: {weight_decay} is negative")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(f"{name}: nesterov: needs momentum > 0 and dampening 0")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults, master_weights, flags)

    def _required(self, group):
        return ("momentum_buffer",) if group.get("momentum") else ()

    def _make(self, pairs, stream, group):
        return _gc.FusedSGD(pairs, stream, lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                            weight_decay=group["weight_decay"], nesterov=bool(group["nesterov"]),
                            master_weights=self._master_weights, maximize=bool(group.get("maximize")))

    def _options(self, group):
        return dict(lr=float(group["lr"]), momentum=float(group["momentum"]), dampening=float(group["dampening"]),
                    weight_decay=float(group["weight_decay"]), nesterov=bool(group["nesterov"]),
                    maximize=bool(group.get("maximize")))

    def _views(self, fused, i, p):
        buf = fused.momentum_buffer(i)
        return _with_master({"momentum_buffer": _view(buf, p) if len(buf) else None}, fused, i, p,
                            self._master_weights)

    def state_dict(self):
        """torch's format, as the installed torch writes it: torch 1.13 keeps ``{'momentum_buffer':
        None}`` for every parameter stepped without momentum, torch 2 keeps no entry for them."""
        sd = super().state_dict()
        if not _torch_sgd_keeps_empty_state():
            sd["state"] = {k: v for k, v in sd["state"].items()
                           if not (set(v) <= {"momentum_buffer"} and v.get("momentum_buffer") is None)}
        return sd
