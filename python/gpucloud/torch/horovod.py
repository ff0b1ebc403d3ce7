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
its last gradient is in (on the stream's worker, overlapping the rest of backward); ``step()``
(or ``synchronize()``) waits for the last ones. One backward per step.
"""
import io
import weakref

import torch

import gpucloud as _gc

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
        if i in self._gc_marked:
            raise _gc.InvalidArgument(f"DistributedOptimizer: gradient of '{self._gc_names[i]}' is ready twice in "
                                      "one step: call step() (or synchronize()) after each backward")
        grad, mirror = self._gc_params[i].grad, self._gc_mirrors[i]
        if grad.data_ptr() != mirror.data_ptr():
            mirror.copy_(grad)
        self._gc_synced = False
        self._gc_marked.add(i)
        self._gc_bucketer.mark_ready(i, stream_for(self._gc_device))

    def synchronize(self):
        """Waits for every gradient's all-reduce; each ``p.grad`` then holds the average over the ranks."""
        if self._gc_synced:
            return
        stream = stream_for(self._gc_device)
        for i, mirror in enumerate(self._gc_mirrors):  # no gradient this step: it contributes zeros
            if i not in self._gc_marked:
                mirror.zero_()
                self._gc_bucketer.mark_ready(i, stream)
        self._gc_bucketer.wait(stream)
        finish(stream, self._gc_device)
        for p, mirror in zip(self._gc_params, self._gc_mirrors):
            if p.grad is None or p.grad.data_ptr() != mirror.data_ptr():
                p.grad = mirror  # the next backward accumulates into it (or a new tensor after set_to_none)
        self._gc_marked.clear()
        self._gc_synced = True

    def step(self, closure=None):
        """Waits for the gradients' all-reduce, then the wrapped optimizer's step."""
        if closure is not None:
            raise _gc.Unsupported("DistributedOptimizer.step: closures re-run backward, which would all-reduce "
                                  "twice in one step")
        self.synchronize()
        return super(_Distributed, self).step()


def DistributedOptimizer(optimizer, comm, named_parameters=None, *, bucket_bytes=25 << 20,
                         first_bucket_bytes=1 << 20, hierarchical=False, wire_dtype=None):
    """Makes ``optimizer`` (any torch.optim.Optimizer, in place; returned) average its gradients over
    ``comm``'s ranks during backward. It stays an instance of its class (isinstance, state, schedulers
    created afterwards all work)."""
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
    options = dict(bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes, hierarchical=hierarchical)
    if wire[wire_dtype] is not None:
        options["wire_dtype"] = wire[wire_dtype]
    base = type(optimizer)
    optimizer.__class__ = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
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
            stream = stream_for(t.device)
            work = t if t.is_contiguous() else t.contiguous()
            comm.broadcast(work.detach(), root, stream)
            finish(stream, t.device)
            if work is not t:
                t.copy_(work)


def broadcast_optimizer_state(optimizer, comm, root=0):
    """Gives every rank ``root``'s optimizer state and hyperparameters (``load_state_dict`` of root's)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state: optimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if not 0 <= root < comm.size:
        raise _gc.InvalidArgument(f"broadcast_optimizer_state: root: {root} is not a rank of {comm.size}")
    stream = stream_for(torch.device("cpu"))
    size = torch.zeros(1, dtype=torch.int64)
    payload = b""
    if comm.rank == root:
        f = io.BytesIO()
        torch.save(optimizer.state_dict(), f)
        payload = f.getvalue()
        size[0] = len(payload)
    comm.broadcast(size, root, stream)
    stream.synchronize()
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(int(size[0]),
                                                                                              dtype=torch.uint8)
    comm.broadcast(data, root, stream)
    stream.synchronize()
    if comm.rank != root:
        optimizer.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes())))
