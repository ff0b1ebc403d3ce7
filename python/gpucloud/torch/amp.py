"""``torch.cuda.amp.GradScaler`` / ``torch.amp.GradScaler`` as a drop-in, over gpucloud's LossScaler.

Same API, defaults, update rule and ``state_dict`` format as torch's, so a state dict saved by
torch's scaler loads into this one and back. The difference: torch reads found-inf on the host
once per step to decide whether to call ``optimizer.step()``; with gpucloud's optimizers
(``gpucloud.torch.optim``) the step is always enqueued and skipped on the device, so a step costs
no host synchronisation on a GPU. Any other ``torch.optim`` optimizer works too, skipped as torch
does (one host read of found-inf per step).

One scale for all optimizers, as torch; found-inf is one flag for the step, so with several
optimizers an overflow in one skips them all (torch skips only the one whose gradients overflowed).
"""
import enum

import torch

import gpucloud as _gc

from ._streams import finish, gc_device, stream_for

__all__ = ["GradScaler"]


class _State(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class GradScaler:
    """Dynamic loss scaling with ``torch.cuda.amp.GradScaler``'s API and semantics; torch 2's
    ``torch.amp.GradScaler("cuda", ...)`` spelling (a device first) is taken too."""

    def __init__(self, *args, device=None, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        if args and isinstance(args[0], (str, torch.device)):  # torch 2: GradScaler("cuda", ...)
            if device is not None:
                raise TypeError("GradScaler: device given twice")
            device, args = args[0], args[1:]
        names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
        if len(args) > len(names):
            raise TypeError(f"GradScaler: takes at most {len(names)} positional arguments after the device")
        given = dict(init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                     growth_interval=growth_interval, enabled=enabled)
        given.update(zip(names, args))
        init_scale, growth_factor, backoff_factor, growth_interval, enabled = (given[n] for n in names)
        self._device_type = None if device is None else torch.device(device).type
        if self._device_type not in (None, "cuda", "cpu"):
            raise _gc.InvalidArgument(f"GradScaler: device: {device!r} is neither 'cuda' nor 'cpu'")
        if not isinstance(enabled, bool):
            raise TypeError(f"GradScaler: enabled: expected a bool, got {type(enabled).__name__}")
        self._enabled = enabled
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        if enabled:  # checked before any tensor is seen
            if not self._init_scale > 0:
                raise ValueError(f"GradScaler: init_scale: {init_scale} is not positive")
            if not self._growth_factor > 1.0:
                raise ValueError(f"GradScaler: growth_factor: {growth_factor} is not above 1")
            if not 0.0 < self._backoff_factor < 1.0:
                raise ValueError(f"GradScaler: backoff_factor: {backoff_factor} is not in (0, 1)")
            if not self._growth_interval >= 1:
                raise ValueError(f"GradScaler: growth_interval: {growth_interval} is below 1")
        self._scaler = None  # gpucloud.LossScaler, made on the device of the first outputs scaled
        self._device = None
        self._scale_view = None  # a torch view of the scale on the device
        self._per_optimizer = {}  # id(optimizer) -> _State

    # -- the scaler on the device ------------------------------------------------------------
    @property
    def loss_scaler(self):
        """The gpucloud.LossScaler underneath (None before the first ``scale``)."""
        return self._scaler

    def _lazy_init(self, device):
        if self._device_type is not None and device.type != self._device_type:
            raise _gc.InvalidArgument(f"GradScaler.scale: outputs on {device}, a GradScaler('{self._device_type}')")
        if self._scaler is not None:
            if device != self._device:
                raise _gc.InvalidArgument(f"GradScaler.scale: outputs on {device}, the scale on {self._device}")
            return
        stream = stream_for(device)
        self._scaler = _gc.LossScaler(gc_device(device), stream, init_scale=self._init_scale,
                                      growth_factor=self._growth_factor, backoff_factor=self._backoff_factor,
                                      growth_interval=self._growth_interval)
        self._device = device
        if self._init_growth_tracker:
            self._scaler.load_state(_gc.LossScalerState(self._init_scale, self._init_growth_tracker), stream)
        finish(stream, device)
        self._scale_view = torch.from_dlpack(self._scaler.scale_value)

    # -- torch's API -------------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs * scale`` (a tensor, or any nesting of lists and tuples of them); no host sync."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            self._lazy_init(outputs.device)
            return outputs * self._scale_view
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: outputs must be a tensor or an iterable of tensors, got "
                        f"{type(outputs).__name__}")

    def unscale_(self, optimizer):
        """Divides ``optimizer``'s gradients by the scale in place (one fused pass) and records overflow."""
        if not self._enabled:
            return
        if self._scaler is None:
            raise RuntimeError("GradScaler.unscale_: scale() has not been called yet: there is nothing to unscale")
        state = self._per_optimizer.get(id(optimizer), _State.READY)
        if state is _State.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state is _State.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if getattr(optimizer, "_gpucloud_distributed", False):
            optimizer.synchronize()  # a DistributedOptimizer's gradients are final once averaged
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        for i, g in enumerate(grads):
            if g.device != self._device:
                raise _gc.InvalidArgument(f"GradScaler.unscale_: gradient {i} is on {g.device}, the scale on "
                                          f"{self._device}")
            if g.is_sparse or not g.is_contiguous():
                raise _gc.InvalidArgument(f"GradScaler.unscale_: gradient {i}: sparse or non-contiguous")
        stream = stream_for(self._device)
        if grads:
            with torch.no_grad():
                self._scaler.unscale(grads, stream)
        finish(stream, self._device)
        self._per_optimizer[id(optimizer)] = _State.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscales (if not yet) and steps; the step is skipped when a gradient was inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        if self._scaler is None:
            raise RuntimeError("GradScaler.step: scale() has not been called yet")
        if self._per_optimizer.get(id(optimizer)) is _State.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if self._per_optimizer.get(id(optimizer), _State.READY) is _State.READY:
            self.unscale_(optimizer)
        result = None
        if getattr(optimizer, "_gpucloud_fused", False):
            optimizer._gpucloud_scaler = self  # the step reads found-inf on the device and skips there
            try:
                result = optimizer.step(*args, **kwargs)
            finally:
                del optimizer._gpucloud_scaler
        elif not self._found_inf():
            result = optimizer.step(*args, **kwargs)
        self._per_optimizer[id(optimizer)] = _State.STEPPED
        return result

    def update(self, new_scale=None):
        """torch's rule (back off on an overflow, grow after growth_interval finite steps), or ``new_scale``."""
        if not self._enabled or self._scaler is None:
            return
        stream = stream_for(self._device)
        if new_scale is not None:
            value = float(new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale)
            if not (value > 0 and value != float("inf")):
                raise _gc.InvalidArgument(f"GradScaler.update: new_scale: {value} is not a positive finite number")
            now = self._scaler.state(stream)  # torch keeps the growth tracker; found-inf is cleared
            self._scaler.load_state(_gc.LossScalerState(value, now.growth_tracker, now.hysteresis_left), stream)
        else:
            self._scaler.update(stream)
        finish(stream, self._device)
        self._per_optimizer.clear()

    def _found_inf(self):
        return self._scaler.state(stream_for(self._device)).found_inf

    def _read_state(self):
        return self._scaler.state(stream_for(self._device))

    def get_scale(self):
        """The scale as a Python float (a host sync on a GPU); 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scaler is None else float(self._read_state().scale)

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def is_enabled(self):
        return self._enabled

    def _get_growth_tracker(self):
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._scaler is None else int(self._read_state().growth_tracker)

    def state_dict(self):
        """torch's format: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict):
        """Loads torch's format (a torch GradScaler's state dict, or this class's). The whole dict is
        checked first (every key, type and range, the growth tracker below the interval); a refused
        dict changes nothing."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        values = _checked_state(state_dict)
        device = self._device
        self.__init__(values["scale"], values["growth_factor"], values["backoff_factor"], values["growth_interval"],
                      True)  # the options are fixed in a device scaler: a new one
        self._init_growth_tracker = values["_growth_tracker"]
        if device is not None:
            self._lazy_init(device)

    # -- pickle, copy.deepcopy, torch.save: as torch's scaler, between iterations ----------------
    def __getstate__(self):
        if self._enabled and any(s is not _State.READY for s in self._per_optimizer.values()):
            raise RuntimeError("A GradScaler instance may only be pickled at the beginning of an iteration, "
                               "or at the end after scaler.update().")
        return {"enabled": self._enabled, "init_scale": self.get_scale() if self._enabled else self._init_scale,
                "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "growth_tracker": self._get_growth_tracker() if self._enabled else 0}

    def __setstate__(self, state):
        self.__init__(state["init_scale"], state["growth_factor"], state["backoff_factor"], state["growth_interval"],
                      state["enabled"])
        self._init_growth_tracker = int(state["growth_tracker"])  # applied on the device at the next scale()


def _checked_state(state_dict):
    """Every entry of a scaler state dict checked, as the values to apply; raises before any is."""
    def number(key, integer=False):
        if key not in state_dict:
            raise _gc.InvalidArgument(f"GradScaler.load_state_dict: state_dict['{key}']: missing")
        v = state_dict[key]
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not float(v).is_integer()):
            raise _gc.InvalidArgument(f"GradScaler.load_state_dict: state_dict['{key}']: {v!r} is not "
                                      f"{'an integer' if integer else 'a number'}")
        v = int(v) if integer else float(v)
        if v != v or v in (float("inf"), float("-inf")):
            raise _gc.InvalidArgument(f"GradScaler.load_state_dict: state_dict['{key}']: {v} is not finite")
        return v

    values = {"scale": number("scale"), "growth_factor": number("growth_factor"),
              "backoff_factor": number("backoff_factor"), "growth_interval": number("growth_interval", True),
              "_growth_tracker": number("_growth_tracker", True)}
    checks = [("scale", values["scale"] > 0, "is not positive"),
              ("growth_factor", values["growth_factor"] > 1.0, "is not above 1"),
              ("backoff_factor", 0.0 < values["backoff_factor"] < 1.0, "is not in (0, 1)"),
              ("growth_interval", values["growth_interval"] >= 1, "is below 1"),
              ("_growth_tracker", 0 <= values["_growth_tracker"] < max(values["growth_interval"], 1),
               f"is not in [0, growth_interval = {values['growth_interval']})")]
    for key, ok, why in checks:
        if not ok:
            raise _gc.InvalidArgument(f"GradScaler.load_state_dict: state_dict['{key}']: {values[key]} {why}")
    return values
