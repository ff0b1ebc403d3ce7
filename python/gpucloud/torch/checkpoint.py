"""Checkpoints of a torch job's whole state, one call each way, through gpucloud.checkpoint
(asynchronous, atomic, sharded across ranks, loadable on another world size)::

    ck = gpucloud.torch.Checkpointer("ckpt", comm=comm, keep_last=3)
    state = {"model": model, "optimizer": opt, "scaler": scaler, "scheduler": sched,
             "extra": {"epoch": epoch, "rng": torch.get_rng_state()}}
    ck.save_async(step, state)          # returns once the tensors are snapshotted
    ...
    step = ck.load(state)               # the newest complete checkpoint, in place; None without one

``state`` is torch's ``state_dict()`` protocol, as torch.distributed.checkpoint takes it: a value
with ``state_dict()`` and ``load_state_dict()`` (modules, DDP-wrapped ones, optimizers, GradScalers,
lr schedulers, your own classes) is saved as its state dict and loaded through
``load_state_dict``; a tensor is saved and loaded into in place; anything else (numbers, strings,
lists, dicts of them and of tensors) is saved as plain data and put back into ``state``.

On disk it is gpucloud's checkpoint format: safetensors files and manifest.json, whose metadata
``torch.state`` (JSON) says how the tensors make up each entry; docs/torch.md has the dozen lines
that load it with torch and safetensors alone.
"""
import json
import math

import torch

import gpucloud as _gc
from gpucloud import checkpoint as _ck

from . import _plain
from ._streams import finish, stream_for

__all__ = ["Checkpointer", "STRUCTURE_KEY"]

STRUCTURE_KEY = "torch.state"  # the manifest metadata entry that describes the state
_FORMAT = 1
# torch dtypes the checkpoint format stores as such; any other (bool, int8, int16, complex) is
# stored as its bytes (uint8) and viewed back on load.
_NATIVE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _NATIVE.add(getattr(torch, _name))


def _stateful(value):
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _unwrapped(value):
    """The module a DistributedDataParallel wraps: its names, without 'module.', fit either."""
    if isinstance(value, torch.nn.parallel.DistributedDataParallel):
        return value.module
    return value


def _check_state(state, call):
    if not isinstance(state, dict):
        raise TypeError(f"{call}: state: expected a dict of name -> stateful object, tensor or plain data, got "
                        f"{type(state).__name__}")
    for key in state:
        if not isinstance(key, str) or not key or "/" in key:
            raise _gc.InvalidArgument(f"{call}: state: key {key!r}: expected a non-empty str without '/'")


class Checkpointer:
    """gpucloud.checkpoint.Checkpointer for torch state dicts (see the module's doc)."""

    def __init__(self, root, comm=None, *, keep_last=0, commit_timeout=600.0):
        self._ck = _ck.Checkpointer(root, keep_last=keep_last, comm=comm, commit_timeout=commit_timeout)

    @property
    def root(self):
        """The directory the checkpoints go under (root/step-N)."""
        return self._ck.root

    def _flatten(self, state, call):
        """{tensor name: contiguous tensor} and the JSON structure naming them."""
        _check_state(state, call)
        tensors, structure = {}, {}
        for key, value in state.items():
            value = _unwrapped(value)
            kind = "stateful" if _stateful(value) else "tensor" if isinstance(value, torch.Tensor) else "data"
            content = value.state_dict() if kind == "stateful" else value

            def on_tensor(t, where, key=key):
                if t.is_sparse or t.layout != torch.strided:
                    raise TypeError(f"{where}: a {t.layout} tensor (save its dense form)")
                name = f"{key}/{len(tensors)}"
                stored = t.detach()
                stub = {"__tensor__": name, "dtype": str(t.dtype).split(".")[1], "shape": list(t.shape)}
                if t.dtype not in _NATIVE:  # kept as its bytes
                    stored = stored.contiguous().reshape(-1).view(torch.uint8)
                tensors[name] = stored
                return stub

            try:
                structure[key] = {"kind": kind, "value": _plain.encode(content, f"{call}: state[{key!r}]", on_tensor)}
            except TypeError as e:
                raise _gc.InvalidArgument(str(e)) from None
        return tensors, {"format": _FORMAT, "entries": structure}

    def _device(self, tensors):
        devices = {t.device for t in tensors.values() if t.device.type != "cpu"}
        if len(devices) > 1:
            raise _gc.InvalidArgument(f"Checkpointer.save: the state's tensors are on {sorted(map(str, devices))}: "
                                      "one GPU (and the CPU) per process")
        return devices.pop() if devices else torch.device("cpu")

    def save_async(self, step, state):
        """Starts a checkpoint of ``state`` at ``step``; returns a gpucloud.checkpoint.PendingSave
        once the tensors are snapshotted (training may change them from then on)."""
        tensors, structure = self._flatten(state, "Checkpointer.save_async")
        device = self._device(tensors)
        stream = stream_for(device)
        pending = self._ck.save_async(step, tensors, stream, metadata={STRUCTURE_KEY: json.dumps(structure)})
        finish(stream, device)  # the snapshot is taken before torch's next operation on them
        return pending

    def save(self, step, state):
        """A checkpoint of ``state`` at ``step``, committed when this returns."""
        self.save_async(step, state).wait()

    def wait(self):
        """Waits for the save in flight; its error, if any, is raised here."""
        self._ck.wait()

    def load(self, state, directory=None, *, verify="before_writing"):
        """Loads the newest complete checkpoint under the root (or ``directory``) into ``state``, in
        place; returns its step, or None when there is none. Every entry of ``state`` must be in the
        checkpoint (others in it are left alone); nothing is changed when a check fails.
        ``verify="while_copying"`` checks each tensor's checksum as it is copied (one read of the
        data, not two: gpucloud.checkpoint.load); a damaged tensor then leaves the ones copied
        before it written."""
        _check_state(state, "Checkpointer.load")
        if directory is None:
            directory = _ck.latest(self.root)
            if directory is None:
                return None
        manifest = _ck.read_manifest(directory)
        try:
            structure = json.loads(manifest.metadata[STRUCTURE_KEY])
            entries = structure["entries"]
            if structure.get("format") != _FORMAT or not isinstance(entries, dict):
                raise ValueError(f"format {structure.get('format')!r}")
        except (KeyError, ValueError, TypeError) as e:
            raise _ck.CheckpointError(f"Checkpointer.load: {directory}: not a gpucloud.torch checkpoint (its "
                                      f"manifest's '{STRUCTURE_KEY}' metadata: {type(e).__name__}: {e})") from None
        missing = [k for k in state if k not in entries]
        if missing:
            raise _ck.CheckpointMismatch(f"Checkpointer.load: {directory}: state[{missing[0]!r}] is not in the "
                                         f"checkpoint (it has {sorted(entries)})")
        # Every tensor the wanted entries name, allocated on the CPU as the manifest says, loaded
        # (and verified) in one call before anything of ``state`` changes.
        wanted = {k: entries[k] for k in state}
        names = set()

        def note(stub):
            names.add(stub["__tensor__"])
            return None

        try:
            for entry in wanted.values():
                _plain.decode(entry["value"], note)
        except (KeyError, ValueError, TypeError, IndexError) as e:
            raise _ck.CheckpointError(f"Checkpointer.load: {directory}: a malformed '{STRUCTURE_KEY}': "
                                      f"{type(e).__name__}: {e}") from None
        # A tensor goes straight into the live tensor it is loaded into (a module's parameter or
        # buffer, a tensor entry) when that fits it exactly, so one copy is made, not two; the C++
        # load verifies every tensor before it writes any. The rest are allocated here.
        live = _live_destinations(wanted, state)
        into, same, used = {}, {}, set()
        for name in names:
            info = manifest.tensors.get(name)
            if info is None:
                raise _ck.CheckpointError(f"Checkpointer.load: {directory}: '{STRUCTURE_KEY}' names tensor "
                                          f"'{name}', which the checkpoint does not hold")
            dtype = _torch_dtype(info.dtype)
            target = live.get(name)
            if (target is not None and _fits(target, dtype, info.shape) and target.data_ptr() not in used):
                used.add(target.data_ptr())
                same[name] = target
                into[name] = target.detach().reshape(tuple(info.shape))  # a view: a 0-d tensor is stored as [1]
            else:
                into[name] = torch.empty(tuple(info.shape), dtype=dtype)
        stream = stream_for(torch.device("cpu"))
        _ck.load(directory, into, stream, strict=False, verify=verify)
        finish(stream, torch.device("cpu"))

        def tensor(stub):
            if stub["__tensor__"] in same:  # loaded in place: load_state_dict's copy_ of it onto itself is a no-op
                return same[stub["__tensor__"]]
            t = into[stub["__tensor__"]]
            dtype = _plain.DTYPES.get(stub.get("dtype"), t.dtype)
            if t.dtype != dtype:  # stored as its bytes
                t = t.view(dtype)
            return t.reshape(stub["shape"])  # a 0-d tensor is stored with shape [1]

        values = {k: _plain.decode(entry["value"], tensor) for k, entry in wanted.items()}
        for key, entry in wanted.items():
            current = _unwrapped(state[key])
            if entry["kind"] == "stateful":
                if not _stateful(current):
                    raise _gc.InvalidArgument(f"Checkpointer.load: state[{key!r}]: saved from an object with "
                                              f"state_dict(), now a {type(current).__name__}")
                current.load_state_dict(values[key])
            elif entry["kind"] == "tensor" and isinstance(current, torch.Tensor):
                if current.shape != values[key].shape:
                    raise _gc.InvalidArgument(f"Checkpointer.load: state[{key!r}]: shape {tuple(current.shape)}, "
                                              f"the checkpoint's {tuple(values[key].shape)}")
                with torch.no_grad():
                    current.copy_(values[key])
            else:
                state[key] = values[key]
        return manifest.step


def _live_destinations(wanted, state):
    """{tensor name: the live tensor it loads into} for the entries whose load would copy each stored
    tensor into a tensor that exists now: a tensor entry, and a module whose state dict has exactly
    the saved keys (its parameters and buffers themselves, keep_vars=True). Others load as before."""
    live = {}
    for key, entry in wanted.items():
        current = _unwrapped(state[key])
        value = entry["value"]
        if entry["kind"] == "tensor" and isinstance(current, torch.Tensor) and isinstance(value, dict) \
                and "__tensor__" in value and list(current.shape) == value.get("shape"):
            live[value["__tensor__"]] = current
        elif entry["kind"] == "stateful" and isinstance(current, torch.nn.Module) and isinstance(value, dict) \
                and isinstance(value.get("__dict__"), list):
            now = current.state_dict(keep_vars=True)
            pairs = value["__dict__"]
            if sorted(str(k) for k, _ in pairs if isinstance(k, str)) != sorted(now) or len(pairs) != len(now):
                continue
            for k, stub in pairs:
                t = now[k]
                if isinstance(stub, dict) and "__tensor__" in stub and isinstance(t, torch.Tensor) \
                        and list(t.shape) == stub.get("shape") and _plain.DTYPES.get(stub.get("dtype")) == t.dtype:
                    live[stub["__tensor__"]] = t
    return live


def _fits(t, dtype, shape):
    """Whether the C++ load may write tensor ``t`` in place: on the CPU, dense and contiguous, of the
    stored dtype (one the format keeps as itself) and element count."""
    return (t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous() and not t.is_conj()
            and not t.is_neg() and t.dtype == dtype and t.dtype in _NATIVE and t.numel() == math.prod(int(d) for d in shape))


def _torch_dtype(name):
    name = str(name).split(".")[-1]
    if name in ("float8_e4m3", "float8_e4m3fn") and hasattr(torch, "float8_e4m3fn"):
        return torch.float8_e4m3fn
    if name == "float8_e5m2" and hasattr(torch, "float8_e5m2"):
        return torch.float8_e5m2
    if name in _plain.DTYPES:
        return _plain.DTYPES[name]
    raise _ck.CheckpointError(f"a tensor of dtype {name}: torch has no such dtype")
