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
import os

import torch
import torch.distributed as dist

import gpucloud as _gc

__all__ = ["ProcessGroupTransport", "init_process_group", "process_group_communicator"]

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


class ProcessGroupTransport:
    """gpucloud.HostTransport's protocol over a torch.distributed process group: what
    ``gpucloud.Communicator.from_transport`` calls, on gpucloud's stream worker thread."""

    def __init__(self, group, ranks):
        self.group = group
        self.ranks = list(ranks)  # global ranks of the group, in group rank order
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        # The tensors of the latest collectives, over memory Python owns: gloo's worker thread
        # drops its references a moment after a collective returns, and must not be the last
        # (freeing them takes the GIL, which a thread cannot take while Python exits: torch 1.13
        # then ends the process with "terminate called without an active exception").
        self._kept = collections.deque(maxlen=16)

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def all_reduce(self, data, dtype, op):
        t = _tensor(data, dtype)
        if t.dtype == torch.bfloat16:  # gloo has no bfloat16 reductions: through fp32, rounded once
            wide = t.float()
            self._kept.append(wide)
            dist.all_reduce(wide, op=_OPS[op], group=self.group)
            t.copy_(wide)
        else:
            self._kept.append(t)
            dist.all_reduce(t, op=_OPS[op], group=self.group)

    def all_gather(self, send, recv, dtype):
        s, r = _tensor(send, dtype), _tensor(recv, dtype)
        chunks = list(r.chunk(self._size))
        self._kept.append((s, r, chunks))
        dist.all_gather(chunks, s, group=self.group)

    def broadcast(self, data, dtype, root):
        t = _tensor(data, dtype)
        self._kept.append(t)
        dist.broadcast(t, src=self.ranks[root], group=self.group)

    def split(self, color, key):
        """The ranks of this group with the same color, by key then rank (a collective of the
        whole job: torch's new_group must be called by every process for every group)."""
        mine = torch.tensor([color, key, self._rank], dtype=torch.int64)
        every = [torch.zeros(3, dtype=torch.int64) for _ in range(self._size)]
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
