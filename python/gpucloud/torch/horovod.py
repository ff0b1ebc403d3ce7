"""Horovod's API for torch scripts that do not use DDP: ``DistributedOptimizer``,
``broadcast_parameters``, ``broadcast_optimizer_state``, over a gpucloud communicator.

::

    comm = gpucloud.Communicator.mpi_world()
    opt = gpucloud.torch.DistributedOptimizer(torch.optim.AdamW(model.parameters()), comm,
                                              named_parameters=model.named_parameters())
    gpucloud.torch.broadcast_parameters(model.state_dict(), comm, root=0)
    gpucloud.torch.broadcast_optimizer_state(opt, comm, root=0)

Gradients are averaged through ``gpucloud.GradBucketer`` as backward produces them: a hook on each
parameter's gradient accumulation marks it ready, and each bucket's all-reduce starts the moment
its last gradient is in (on the stream's worker, overlapping the rest of backward). As under DDP,
``backward()`` returns with every ``p.grad`` averaged: clipping or any other edit of the gradients
between ``backward()`` and ``step()`` applies to the average. Horovod's recipe (``synchronize()``,
then the edit, then ``step()`` under ``skip_synchronize()``) works as well.
``backward_passes_per_step=N`` accumulates N backwards locally and averages the sum once.
"""
import contextlib
import json
import weakref

import torch

import gpucloud as _gc

from . import _plain
from ._streams import finish, stream_for

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state"]


class _Distributed:
    """Mixed into the user's optimizer class: all-reduce hooks, synchronize(), step()."""

    _gpucloud_distributed = True

    def _gc_setup(self, comm, named_parameters, options):
        params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not params:
            raise _gc.InvalidArgument("DistributedOptimizer: optimizer: no parameter requires a gradient")
        names = {}
        if named_parameters is not None:
            named = list(named_parameters)
            for i, item in enumerate(named):
                if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
                    raise TypeError(f"DistributedOptimizer: named_parameters[{i}]: expected a (name, tensor) pair, "
                                    f"got {type(item).__name__}")
            names = {id(p): n for n, p in named}
            missing = [i for i, p in enumerate(params) if id(p) not in names]
            if missing:
                raise _gc.InvalidArgument(f"DistributedOptimizer: named_parameters: the optimizer's parameter "
                                          f"{missing[0]} is not among them")
        self._gc_comm = comm
        self._gc_device = params[0].device
        for i, p in enumerate(params):
            if p.device != self._gc_device:
                raise _gc.InvalidArgument(f"DistributedOptimizer: parameter {names.get(id(p), i)} is on {p.device}, "
                                          f"the first on {self._gc_device}")
        # Backward produces gradients roughly in reverse order: register them so (buckets fill in turn).
        self._gc_params = list(reversed(params))
        self._gc_names = [names.get(id(p), str(len(params) - 1 - i)) for i, p in enumerate(self._gc_params)]
        self._gc_mirrors = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self._gc_params]
        self._gc_bucketer = _gc.GradBucketer(comm, self._gc_mirrors, **options)
        self._gc_marked = set()
        self._gc_synced = True
        self._gc_averaged = False  # synchronized since the last step() or zero_grad()
        self._gc_skip = False  # inside skip_synchronize()
        self._gc_passes = [0] * len(self._gc_params)  # backwards accumulated since the last all-reduce
        self._gc_callback = False  # the end-of-backward synchronize is queued
        self._gc_hooks = []
        for i, p in enumerate(self._gc_params):
            self._gc_hooks.append(self._gc_hook(i, p))

    def _gc_hook(self, i, p):
        me = weakref.ref(self)  # the hook must not keep the optimizer alive (nor form a cycle)

        def ready(*_):
            opt = me()
            if opt is not None:
                opt._gc_ready(i)

        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            return p.register_post_accumulate_grad_hook(lambda _p: ready())
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]  # torch 1.x: the AccumulateGrad node
        accumulator.register_hook(ready)
        return accumulator  # kept: the hook lives as long as the node

    def _gc_ready(self, i):
        if self._gc_averaged or i in self._gc_marked:
            raise _gc.InvalidArgument(
                f"DistributedOptimizer: gradient of '{self._gc_names[i]}' computed again after its average: more "
                f"backwards than backward_passes_per_step ({self._gc_passes_per_step}) before step() or "
                "zero_grad(); pass backward_passes_per_step=N to accumulate N backwards locally")
        self._gc_passes[i] += 1
        if self._gc_passes[i] < self._gc_passes_per_step:
            return  # accumulated locally; averaged after the last pass
        if not self._gc_callback:  # as DDP: backward returns with every gradient averaged
            self._gc_callback = True
            torch.autograd.Variable._execution_engine.queue_callback(self._gc_end_of_backward)
        self._gc_mark(i, stream_for(self._gc_device))

    def _gc_mark(self, i, stream):
        """Starts gradient ``i``'s part of the all-reduce (zeros when it has none)."""
        grad, mirror = self._gc_params[i].grad, self._gc_mirrors[i]
        if grad is None:
            mirror.zero_()
        elif grad.data_ptr() != mirror.data_ptr():
            mirror.copy_(grad)
        self._gc_synced = False
        self._gc_passes[i] = 0
        self._gc_marked.add(i)
        self._gc_bucketer.mark_ready(i, stream)

    def _gc_end_of_backward(self):
        self._gc_callback = False
        self.synchronize()

    def synchronize(self):
        """Waits for every gradient's all-reduce; each ``p.grad`` then holds the average over the ranks.
        (backward() calls it at its end once the last pass of a step is in.)"""
        if self._gc_synced:
            return
        stream = stream_for(self._gc_device)
        for i in range(len(self._gc_mirrors)):  # no gradient this step: what it accumulated, or zeros
            if i not in self._gc_marked:
                self._gc_mark(i, stream)
        self._gc_bucketer.wait(stream)
        finish(stream, self._gc_device)
        for p, mirror in zip(self._gc_params, self._gc_mirrors):
            if p.grad is None or p.grad.data_ptr() != mirror.data_ptr():
                p.grad = mirror  # the next backward accumulates into it (or a new tensor after set_to_none)
        self._gc_marked.clear()
        self._gc_synced = True
        self._gc_averaged = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: ``step()`` inside it does not synchronize (call ``synchronize()`` first, then
        clip or unscale, then step)."""
        self._gc_skip = True
        try:
            yield
        finally:
            self._gc_skip = False

    def step(self, closure=None):
        """Waits for the gradients' all-reduce (unless under ``skip_synchronize()``), then the wrapped
        optimizer's step."""
        if closure is not None:
            raise _gc.Unsupported("DistributedOptimizer.step: closures re-run backward, which would all-reduce "
                                  "twice in one step")
        if not self._gc_skip:
            self.synchronize()
        out = super(_Distributed, self).step()
        self._gc_new_step()
        return out

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's; also starts a new step (a step skipped by a GradScaler included)."""
        super(_Distributed, self).zero_grad(*args, **kwargs)
        self._gc_new_step()

    def _gc_new_step(self):
        if self._gc_synced:
            self._gc_averaged = False
            self._gc_passes = [0] * len(self._gc_params)


def DistributedOptimizer(optimizer, comm, named_parameters=None, *, bucket_bytes=25 << 20,
                         first_bucket_bytes=1 << 20, hierarchical=False, wire_dtype=None,
                         backward_passes_per_step=1):
    """Makes ``optimizer`` (any torch.optim.Optimizer, in place; returned) average its gradients over
    ``comm``'s ranks during backward. It stays an instance of its class (isinstance, state, schedulers
    created afterwards all work). ``backward_passes_per_step``: backwards accumulated locally per
    step (Horovod's); the sum is averaged over the ranks during the last one."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer: optimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not isinstance(comm, _gc.Communicator):
        raise TypeError(f"DistributedOptimizer: comm: expected a gpucloud.Communicator, got {type(comm).__name__}")
    if isinstance(optimizer, _Distributed):
        raise _gc.InvalidArgument("DistributedOptimizer: optimizer: already distributed")
    if "step" in vars(optimizer):
        raise _gc.InvalidArgument("DistributedOptimizer: optimizer: its step was wrapped (an lr scheduler made "
                                  "before this call): create schedulers after DistributedOptimizer")
    wire = {None: None, torch.float16: "float16", torch.bfloat16: "bfloat16"}
    if wire_dtype not in wire:
        raise _gc.InvalidArgument(f"DistributedOptimizer: wire_dtype: {wire_dtype} is not None, torch.float16 "
                                  "or torch.bfloat16")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) or \
            backward_passes_per_step < 1:
        raise _gc.InvalidArgument(f"DistributedOptimizer: backward_passes_per_step: {backward_passes_per_step!r} is "
                                  "not a positive integer")
    options = dict(bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes, hierarchical=hierarchical)
    if wire[wire_dtype] is not None:
        options["wire_dtype"] = wire[wire_dtype]
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
    optimizer._gc_passes_per_step = backward_passes_per_step
    try:
        optimizer._gc_setup(comm, named_parameters, options)
    except BaseException:
        optimizer.__class__ = base
        raise
    return optimizer


def _tensors(params):
    if isinstance(params, torch.nn.Module):
        return list(params.state_dict().items())
    if isinstance(params, dict):
        return list(params.items())
    out = []
    for i, item in enumerate(params):
        if isinstance(item, tuple) and len(item) == 2:
            out.append(item)
        elif isinstance(item, torch.Tensor):
            out.append((str(i), item))
        else:
            raise TypeError(f"broadcast_parameters: params[{i}]: expected a tensor or a (name, tensor) pair, got "
                            f"{type(item).__name__}")
    return out


def broadcast_parameters(params, comm, root=0):
    """Overwrites every tensor of ``params`` (a module, a state dict, or tensors) with ``root``'s, in place."""
    if not isinstance(comm, _gc.Communicator):
        raise TypeError(f"broadcast_parameters: comm: expected a gpucloud.Communicator, got {type(comm).__name__}")
    if not 0 <= root < comm.size:
        raise _gc.InvalidArgument(f"broadcast_parameters: root: {root} is not a rank of {comm.size}")
    with torch.no_grad():
        for name, t in _tensors(params):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"broadcast_parameters: '{name}': expected a tensor, got {type(t).__name__}")
            if t.numel() == 0:
                continue
            if t.is_sparse:
                raise _gc.InvalidArgument(f"broadcast_parameters: '{name}': a sparse tensor (send its dense form)")
            stream = stream_for(t.device)
            work = t.detach() if t.is_contiguous() else t.detach().contiguous()
            # A broadcast copies bytes: every dtype (bool buffers, int8, complex) goes as uint8.
            comm.broadcast(work.reshape(-1).view(torch.uint8), root, stream)
            finish(stream, t.device)
            if work.data_ptr() != t.data_ptr():
                t.copy_(work)


# broadcast_optimizer_state's wire format: a JSON description (plain data only: numbers, strings,
# bools, None, lists, tuples, dicts with str or int keys; tensors as {"__tensor__": i}) and one
# uint8 buffer holding every tensor's bytes, each at a 16-byte aligned offset. No pickle: what a
# rank receives is data, never code, whatever the root sends.
_MAX_DESCRIPTION_BYTES = 64 << 20
_ALIGN = 16


def _encode_state(state_dict):
    """The wire description's body and the tensors it references by index."""
    tensors = []

    def on_tensor(value, where):
        t = value.detach().to("cpu")
        name = str(t.dtype).split(".")[1]
        if name not in _plain.DTYPES or t.is_sparse:
            raise TypeError(f"broadcast_optimizer_state: {where}: a {t.dtype} tensor cannot be sent")
        tensors.append(t.contiguous())
        return {"__tensor__": len(tensors) - 1, "dtype": name, "shape": list(t.shape)}

    try:
        return _plain.encode(state_dict, "state_dict", on_tensor), tensors
    except TypeError as e:
        raise TypeError(f"broadcast_optimizer_state: {e}") from None


def _tensors_from(description, data):
    """The tensors the description lists, checked against the bytes (a malformed one raises)."""
    out = []
    offset = 0
    for i, spec in enumerate(description["tensors"]):
        dtype = _plain.DTYPES[spec["dtype"]]  # KeyError for anything else
        shape = [int(d) for d in spec["shape"]]
        if any(d < 0 for d in shape) or len(shape) > 64:
            raise ValueError(f"tensor {i}: shape {shape}")
        numel = 1
        for d in shape:
            numel *= d
        n = numel * torch.empty((), dtype=dtype).element_size()
        if offset + n > data.numel():
            raise ValueError(f"tensor {i}: {n} bytes at {offset}, past the {data.numel()} sent")
        chunk = data[offset:offset + n]
        out.append(chunk.view(dtype).reshape(shape).clone() if n else torch.empty(shape, dtype=dtype))
        offset = -(-(offset + n) // _ALIGN) * _ALIGN
    return out


def broadcast_optimizer_state(optimizer, comm, root=0):
    """Gives every rank ``root``'s optimizer state and hyperparameters (``load_state_dict`` of root's).

    The state moves as tensors and plain data, never as a pickle: a compromised or corrupt root
    cannot run code on the other ranks; a malformed message raises CommunicationError there."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state: optimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not 0 <= root < comm.size:
        raise _gc.InvalidArgument(f"broadcast_optimizer_state: root: {root} is not a rank of {comm.size}")
    stream = stream_for(torch.device("cpu"))
    sizes = torch.zeros(2, dtype=torch.int64)  # description bytes (-1: root failed), tensor bytes
    description = b""
    error = None
    if comm.rank == root:
        try:
            body, sent = _encode_state(optimizer.state_dict())
            offsets, total = [], 0
            for t in sent:
                offsets.append(total)
                total = -(-(total + t.numel() * t.element_size()) // _ALIGN) * _ALIGN
            description = json.dumps({"state_dict": body, "tensors": [
                {"dtype": str(t.dtype).split(".")[1], "shape": list(t.shape)} for t in sent]}).encode()
            sizes[0], sizes[1] = len(description), total
        except Exception as e:  # the other ranks are told, so that they do not wait for ever
            error = e
            sizes[0] = -1
    comm.broadcast(sizes, root, stream)
    stream.synchronize()
    if int(sizes[0]) < 0:
        if error is not None:
            raise error
        raise _gc.CommunicationError(f"broadcast_optimizer_state: rank {root} could not send its optimizer state")
    if not 0 <= int(sizes[0]) <= _MAX_DESCRIPTION_BYTES or int(sizes[1]) < 0 or int(sizes[1]) > 1 << 40:
        raise _gc.CommunicationError(f"broadcast_optimizer_state: rank {root} sent sizes {sizes.tolist()}: malformed")
    text = torch.empty(int(sizes[0]), dtype=torch.uint8)
    data = torch.zeros(int(sizes[1]), dtype=torch.uint8)
    if comm.rank == root:
        text = torch.frombuffer(bytearray(description), dtype=torch.uint8) if description else text
        for t, off in zip(sent, offsets):
            n = t.numel() * t.element_size()
            if n:
                data[off:off + n] = t.reshape(-1).view(torch.uint8)
    if text.numel():
        comm.broadcast(text, root, stream)
    if data.numel():
        comm.broadcast(data, root, stream)
    stream.synchronize()
    if comm.rank == root:
        return
    try:
        message = json.loads(text.numpy().tobytes().decode("utf-8"))
        received = _tensors_from(message, data)
        state_dict = _plain.decode(message["state_dict"], lambda stub: received[stub["__tensor__"]])
        if not isinstance(state_dict, dict):
            raise ValueError("not a state dict")
    except (ValueError, KeyError, TypeError, IndexError, RecursionError, UnicodeDecodeError) as e:
        raise _gc.CommunicationError(f"broadcast_optimizer_state: rank {root} sent a malformed optimizer state: "
                                     f"{type(e).__name__}: {e}") from None
    optimizer.load_state_dict(state_dict)
