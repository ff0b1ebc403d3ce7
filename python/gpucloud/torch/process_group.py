"""A gpucloud communicator over a ``torch.distributed`` process group (gloo on the CPU).

For jobs that torch starts without MPI (torchrun, ``mp.spawn``): gpucloud's collectives, checks,
timeouts, gradient buckets and hierarchical all-reduce on host buffers, over the job's own gloo
connections::

    torch.distributed.init_process_group("gloo")          # as the job already does
    comm = gpucloud.torch.process_group_communicator()    # every rank calls it
    comm.all_reduce(x, x, stream)

The communicator gets a gloo group of its own (``new_group`` over the same ranks), so its
collectives, which run on gpucloud's stream worker thread, never interleave with the job's own
calls on the default group. Each collective is one agreement all-reduce (the ranks state what
they run; a mismatch is a ``CommunicationError`` on every rank) and then the data's gloo calls.
Nodes are found from the ranks' host names; ``GPUCLOUD_LOCAL_SIZE`` simulates them.
"""
import collections
import contextlib
import functools
import os
import sys
import time

import torch
import torch.distributed as dist

import gpucloud as _gc

__all__ = ["ProcessGroupTransport", "init_process_group", "process_group_communicator", "settled"]

_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "int8": torch.int8,
}
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _tensor(memory, dtype):
    """A tensor over a memoryview's bytes (no copy)."""
    if dtype not in _DTYPES:
        raise _gc.InvalidArgument(f"process group transport: dtype {dtype} has no torch equivalent")
    return torch.frombuffer(memory, dtype=_DTYPES[dtype])


def _python_references(tensors):
    return [sys.getrefcount(t) for t in tensors]


@functools.lru_cache(maxsize=None)
def _cxx_owners_hold_a_python_reference():
    """Whether this torch keeps a tensor's Python object alive while C++ also owns the tensor (torch
    2.15 does; 1.13 does not, and frees the object from the last C++ owner when Python has dropped
    it). Probed: a view owns its base in C++."""
    t = torch.zeros(1)
    before = _python_references((t,))
    view = t.view(1)
    held = _python_references((t,)) > before
    del view
    return held


# torch without that reference (1.13): the tensors of the latest settled() blocks, so that Python
# still holds them when a worker drops its references (else the worker frees the Python object,
# under the GIL).
_recent = collections.deque(maxlen=16)


@contextlib.contextmanager
def settled(*tensors, timeout=60.0):
    """A context manager around ``torch.distributed`` calls on ``tensors`` (tensors, or lists of
    them as the calls take them; gloo): on leaving, it waits until torch's worker threads hold no
    reference to them, so that no worker is left to release one while the interpreter exits, which
    aborts the process ("terminate called without an active exception" from
    ``ProcessGroupGloo::runLoop``; torch 2.15: a worker drops its references after the call has
    returned, and dropping the last C++ reference to a tensor Python holds takes the GIL). The
    block must not keep new references to ``tensors``; ``CommunicationError`` after ``timeout``
    seconds. Where torch instead frees a tensor's Python object from its last C++ owner (1.13), it
    keeps the last 16 blocks' tensors referenced, so that a worker never drops the last one::

        with gpucloud.torch.settled(everyone, mine):
            dist.all_gather(everyone, mine)
    """
    if not timeout > 0:
        raise _gc.InvalidArgument(f"settled: timeout must be > 0 seconds, got {timeout!r}")
    flat = []
    for i, arg in enumerate(tensors):
        for t in arg if isinstance(arg, (list, tuple)) else (arg,):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"settled: argument {i}: expected a tensor or a list of tensors, "
                                f"got {type(t).__name__}")
            flat.append(t)
    tensors = tuple(flat)  # measured through the same tuple before and after: equal offsets
    del flat
    if not _cxx_owners_hold_a_python_reference():
        _recent.append(tensors)
        yield
        return
    before = _python_references(tensors)
    yield
    deadline = time.monotonic() + timeout
    while any(now > then for now, then in zip(_python_references(tensors), before)):
        if time.monotonic() > deadline:
            held = [i for i, (now, then) in enumerate(zip(_python_references(tensors), before)) if now > then]
            raise _gc.CommunicationError(
                f"settled: tensors {held} still have {timeout:g} s later more references than before the "
                "block: a collective still running, or the block kept a reference")
        time.sleep(0)  # lets the worker take the GIL it releases its reference under


class ProcessGroupTransport:
    """gpucloud.HostTransport's protocol over a torch.distributed process group: what
    ``gpucloud.Communicator.from_transport`` calls, on gpucloud's stream worker thread."""

    def __init__(self, group, ranks):
        self.group = group
        self.ranks = list(ranks)  # global ranks of the group, in group rank order
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_reduce(self, data, dtype, op):
        t = _tensor(data, dtype)
        if t.dtype == torch.bfloat16:  # gloo has no bfloat16 reductions: through fp32, rounded once
            wide = t.float()
            with settled(wide):
                dist.all_reduce(wide, op=_OPS[op], group=self.group)
            t.copy_(wide)
        else:
            with settled(t):
                dist.all_reduce(t, op=_OPS[op], group=self.group)

    def all_gather(self, send, recv, dtype):
        s, r = _tensor(send, dtype), _tensor(recv, dtype)
        chunks = list(r.chunk(self._size))
        with settled(s, *chunks):
            dist.all_gather(chunks, s, group=self.group)

    def broadcast(self, data, dtype, root):
        t = _tensor(data, dtype)
        with settled(t):
            dist.broadcast(t, src=self.ranks[root], group=self.group)

    def split(self, color, key):
        """The ranks of this group with the same color, by key then rank (a collective of the
        whole job: torch's new_group must be called by every process for every group)."""
        mine = torch.tensor([color, key, self._rank], dtype=torch.int64)
        every = [torch.zeros(3, dtype=torch.int64) for _ in range(self._size)]
        with settled(mine, *every):
            dist.all_gather(every, mine, group=self.group)
        colors = {}
        for c, k, r in (t.tolist() for t in every):
            colors.setdefault(c, []).append((k, r))
        part = None
        for c in sorted(colors):
            members = [self.ranks[r] for _, r in sorted(colors[c])]
            group = dist.new_group(ranks=members, backend="gloo")
            if c == color:
                part = ProcessGroupTransport(group, members)
        return part


def process_group_communicator(group=None):
    """A gpucloud communicator over the ranks of ``group`` (default: the whole job), on a gloo
    group of its own. ``torch.distributed`` must be initialised; every rank of the job calls it."""
    if not dist.is_available() or not dist.is_initialized():
        raise _gc.InvalidArgument("process_group_communicator: torch.distributed is not initialised "
                                  "(call torch.distributed.init_process_group first)")
    ranks = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group) \
        if hasattr(dist, "get_process_group_ranks") else None
    if ranks is None:
        raise _gc.Unsupported("process_group_communicator: a sub-group needs torch >= 2.0 "
                              "(get_process_group_ranks); pass group=None")
    own = dist.new_group(ranks=ranks, backend="gloo")
    if dist.get_rank() not in ranks:
        raise _gc.InvalidArgument("process_group_communicator: this process is not in the group")
    return _gc.Communicator.from_transport(ProcessGroupTransport(own, ranks))


def init_process_group(comm, backend="gloo", timeout=None):
    """``torch.distributed.init_process_group`` for a job an MPI launcher (mpirun, srun) started,
    which sets none of torch's rendezvous variables: rank 0 picks a free port on its host
    (``MASTER_ADDR`` when set, else its host name: 127.0.0.1 on rank 0's host) and ``comm`` (a gpucloud.Communicator, every rank
    calls this) tells the others; ranks and world size are the communicator's. Under torchrun
    call ``torch.distributed.init_process_group`` as usual."""
    import socket

    if not isinstance(comm, _gc.Communicator):
        raise TypeError(f"init_process_group: comm: expected a gpucloud.Communicator, got {type(comm).__name__}")
    if dist.is_initialized():
        raise _gc.InvalidArgument("init_process_group: torch.distributed is initialised already")
    address = torch.zeros(258, dtype=torch.uint8)  # port (2 bytes), then the host, NUL-padded
    if comm.rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        encoded = host.encode()[:256]
        address[0], address[1] = port >> 8, port & 0xFF
        address[2:2 + len(encoded)] = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)
    stream = _gc.Stream()
    comm.broadcast(address, 0, stream)
    stream.synchronize()
    port = int(address[0]) << 8 | int(address[1])
    host = bytes(address[2:].tolist()).rstrip(b"\0").decode()
    if host == socket.gethostname():  # rank 0's own host: over the loopback (the name may not resolve)
        host = "127.0.0.1"
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=comm.rank, world_size=comm.size,
                            **kwargs)
