"""DDP communication hooks over gpucloud's all-reduce, for ``DistributedDataParallel.register_comm_hook``.

::

    comm = gpucloud.Communicator.mpi_world()            # or nccl_from_mpi() on GPUs
    model = DDP(model)                                   # DDP still needs a process group (gloo on CPU)
    model.register_comm_hook(gpucloud.torch.ddp.HookState(comm), gpucloud.torch.ddp.allreduce_hook)

Each bucket DDP hands over is averaged over the ranks by gpucloud's all-reduce (ring, or the
two-level hierarchical one with ``hierarchical_allreduce_hook``) on the framework's stream, optionally
sent as bf16/fp16 (``HookState(comm, wire_dtype=torch.bfloat16)``, as DDP's compression hooks). The
returned ``torch.futures.Future`` completes with the averaged bucket. A failed collective (a peer
that died, a timeout) makes ``backward()`` raise the library's own exception
(``gpucloud.CommunicationError`` naming the collective), from a callback queued at the end of
backward's graph: DDP's reducer cannot carry a Python exception through a future (it would raise
``RuntimeError: Unable to cast ...``), so the future completes with the bucket as it is and a
callback, once the bucket's future is done, raises the error.

The hook returns at once: DDP calls it as each bucket fills during backward, and the all-reduce
runs on gpucloud's stream while backward goes on computing the next buckets' gradients. On the
CPU the future completes when the all-reduce has finished (a stream callback,
``gpucloud.add_callback``, hands it the result or the collective's error); on a GPU the
all-reduce is queued on the current stream and the future completes when it is queued, as NCCL
hooks do (later work on that stream is ordered after it).
"""
import torch

import gpucloud as _gc

from ._streams import stream_for

__all__ = ["HookState", "allreduce_hook", "hierarchical_allreduce_hook"]

_WIRE = {None: None, torch.float32: None, torch.float16: torch.float16, torch.bfloat16: torch.bfloat16}


class HookState:
    """What the hooks need: the gpucloud communicator, and the dtype on the wire (None: the bucket's)."""

    def __init__(self, comm, wire_dtype=None):
        if not isinstance(comm, _gc.Communicator):
            raise TypeError(f"HookState: comm: expected a gpucloud.Communicator, got {type(comm).__name__}")
        if wire_dtype not in _WIRE:
            raise _gc.InvalidArgument(f"HookState: wire_dtype: {wire_dtype} is not None, torch.float16 or "
                                      "torch.bfloat16")
        self.comm = comm
        self.wire_dtype = _WIRE[wire_dtype]
        self.calls = 0  # buckets reduced so far
        self._error = None  # the first failure not raised yet


def _check(state, future):
    """Queued at the end of backward's graph for each bucket: once its future is done, raises the
    first failure not raised yet as what it is."""
    future.wait()
    error, state._error = state._error, None
    if error is not None:
        raise error


def _failed(state, future, buffer, error, in_backward):
    if not in_backward:  # called directly: the future carries the error
        future.set_exception(error)
        return
    if state._error is None:
        state._error = error
    future.set_result(buffer)  # DDP reads a tensor; _check raises the error


def _hook(state, bucket, hierarchical):
    future = torch.futures.Future()
    try:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _check(state, future))
        in_backward = True
    except RuntimeError:  # not called by DDP during backward
        in_backward = False
    try:
        buffer = bucket.buffer()
        state.calls += 1
        stream = stream_for(buffer.device)
        comm = state.comm
        wire = buffer if state.wire_dtype is None else buffer.to(state.wire_dtype)
        wire.div_(comm.size)
        if hierarchical:
            comm.hierarchical_all_reduce(wire, wire, stream)
        else:
            comm.all_reduce(wire, wire, stream)
        if buffer.device.type == "cpu":
            _gc.add_callback(stream, lambda error: _complete(state, future, buffer, wire, error, in_backward))
            return future
        if wire is not buffer:
            buffer.copy_(wire)  # queued on the same (current) stream, after the all-reduce
        future.set_result(buffer)
    except Exception as e:  # noqa: BLE001 - raised from backward() by _check
        _failed(state, future, bucket.buffer(), e, in_backward)
    return future


def _complete(state, future, buffer, wire, error, in_backward):
    """On the stream, once the bucket's all-reduce finished: the averaged bucket, or the error."""
    try:
        if error is not None:
            raise error
        if wire is not buffer:
            buffer.copy_(wire)
        future.set_result(buffer)
    except Exception as e:  # noqa: BLE001 - raised from backward() by _check
        _failed(state, future, buffer, e, in_backward)


def allreduce_hook(state: HookState, bucket):
    """The bucket averaged over the ranks by gpucloud's ring all-reduce."""
    return _hook(state, bucket, hierarchical=False)


def hierarchical_allreduce_hook(state: HookState, bucket):
    """The bucket averaged by gpucloud's two-level all-reduce (within nodes, across nodes, within nodes)."""
    return _hook(state, bucket, hierarchical=True)
