"""Building NCCL communicators in scripts launched by torchrun (or anything with a key-value store).

NCCL needs one unique id, made by rank 0 and handed to every rank. Under ``mpirun`` use
``Communicator.nccl_from_mpi()`` (all ranks) or ``nccl_from_mpi4py(comm)`` (the ranks of any
mpi4py communicator). Under ``torchrun`` the launcher already runs a key-value store; these helpers pass
the id through it (or through any object with ``set(key, bytes)`` and a blocking
``get(key) -> bytes``, such as ``torch.distributed.TCPStore`` or ``FileStore``)::

    comm = gpucloud.distributed.nccl_from_torchrun()        # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*
"""
import os

from ._core import Communicator, Device, cuda_device_count

DEFAULT_KEY = "gpucloud/nccl_unique_id"


def exchange_nccl_id(store, rank, key=DEFAULT_KEY):
    """Rank 0 makes a NCCL unique id and publishes it under ``key``; every rank returns it (the
    others wait for it: ``store.get`` blocks until the key exists or the store times out)."""
    if rank == 0:
        store.set(key, Communicator.nccl_unique_id())
    return bytes(store.get(key))


def nccl_from_store(store, rank, size, device=None, key=DEFAULT_KEY):
    """A NCCL communicator, its unique id exchanged through ``store``; the GPU is ``device`` or
    ``cuda:(rank % visible GPUs)``. A collective: every rank calls it."""
    if not 0 <= rank < size:
        raise ValueError(f"rank: {rank} is not a rank of {size}")
    if device is None:
        gpus = cuda_device_count()
        if gpus == 0:
            raise RuntimeError("device: no GPU is visible, and NCCL communicators live on GPUs")
        device = Device.cuda(rank % gpus)
    return Communicator.nccl(exchange_nccl_id(store, rank, key), rank, size, device)


def exchange_nccl_id_mpi(comm):
    """Rank 0 of an mpi4py communicator makes a NCCL unique id and broadcasts it; every rank returns
    it (a collective over ``comm``)."""
    return comm.bcast(Communicator.nccl_unique_id() if comm.Get_rank() == 0 else None, root=0)


def nccl_from_mpi4py(comm, device=None):
    """A NCCL communicator over the ranks of an mpi4py communicator (any split of the world), the
    id broadcast through it; the GPU is ``device`` or ``cuda:(rank % visible GPUs)``."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if device is None:
        gpus = cuda_device_count()
        if gpus == 0:
            raise RuntimeError("device: no GPU is visible, and NCCL communicators live on GPUs")
        device = Device.cuda(rank % gpus)
    return Communicator.nccl(exchange_nccl_id_mpi(comm), rank, size, device)


def torchrun_store(timeout_seconds=300):
    """The key-value store of a ``torchrun`` job and this process's (rank, size), as
    ``init_process_group("env://")`` finds them: a TCPStore at MASTER_ADDR:MASTER_PORT, hosted by
    torchrun's agent when TORCHELASTIC_USE_AGENT_STORE is "True" (static rendezvous), else by
    rank 0 (c10d rendezvous). Needs PyTorch."""
    import datetime

    import torch.distributed as dist

    env = os.environ
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in env]
    if missing:
        raise RuntimeError(f"torchrun_store: {', '.join(missing)} not set: not launched by torchrun")
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    hosted_by_agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), size, rank == 0 and not hosted_by_agent,
                          datetime.timedelta(seconds=timeout_seconds))
    return store, rank, size


def nccl_from_torchrun(device=None, key=DEFAULT_KEY, timeout_seconds=300):
    """Under ``torchrun``: the id exchanged through the job's store (``torchrun_store``), the
    communicator built on ``cuda:LOCAL_RANK`` unless ``device`` is given. Needs PyTorch."""
    store, rank, size = torchrun_store(timeout_seconds)
    if device is None and "LOCAL_RANK" in os.environ:
        device = Device.cuda(int(os.environ["LOCAL_RANK"]))
    return nccl_from_store(store, rank, size, device, key)
