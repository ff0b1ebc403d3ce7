"""PyTorch drop-ins over gpucloud (imports torch; ``import gpucloud`` alone never does).

- ``gpucloud.torch.GradScaler``: ``torch.cuda.amp.GradScaler``'s API, defaults, rule and state dict;
  with gpucloud's optimizers an overflow step is skipped on the device (no host sync per step).
- ``gpucloud.torch.optim.AdamW`` / ``Adam`` / ``SGD``: ``torch.optim.Optimizer`` subclasses over the
  fused multi-tensor kernels, state dicts interchangeable with torch's own.
- ``gpucloud.torch.ddp``: communication hooks for ``DistributedDataParallel.register_comm_hook``.
- ``DistributedOptimizer``, ``broadcast_parameters``, ``broadcast_optimizer_state``: Horovod's API.
- ``process_group_communicator()``: a gpucloud communicator over the job's ``torch.distributed``
  (gloo) process group, for jobs without MPI (torchrun on CPUs); ``init_process_group(comm)``:
  torch's process group for a job mpirun or srun started, its rendezvous over ``comm``.
- ``Checkpointer``: checkpoints of a torch job's whole state (model, optimizer, scaler, scheduler,
  your own), one call each way: ``save_async(step, state)``, ``load(state)``.
- ``stream(device)``: the gpucloud stream the drop-ins use for tensors on ``device``: the stream to
  give ``gpucloud.elastic.JobControl.should_stop`` and other collectives of the same communicator.

Each is a one-line change in a torch script::

    scaler = gpucloud.torch.GradScaler()                       # was torch.cuda.amp.GradScaler()
    opt = gpucloud.torch.optim.AdamW(model.parameters(), 1e-3)  # was torch.optim.AdamW(...)
"""
import torch as _torch  # noqa: F401  (a clear ImportError here when torch is missing)

from . import ddp, optim  # noqa: F401
from .amp import GradScaler  # noqa: F401
from .checkpoint import Checkpointer  # noqa: F401
from .horovod import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters  # noqa: F401
from ._streams import stream_for as _stream_for
from .process_group import ProcessGroupTransport, init_process_group, process_group_communicator  # noqa: F401


def stream(device="cpu"):
    """The gpucloud stream the drop-ins run their work on for tensors on ``device`` (a
    ``torch.device`` or its name): torch's current stream on a GPU, the process's host stream on
    the CPU. Collectives must reach a communicator in the same order on every rank: give this
    stream to ``JobControl.should_stop`` (or any collective of your own on the communicator the
    hooks use), so it is ordered with the gradient all-reduces."""
    return _stream_for(_torch.device(device))


__all__ = ["Checkpointer", "DistributedOptimizer", "GradScaler", "ProcessGroupTransport", "broadcast_optimizer_state",
           "broadcast_parameters", "ddp", "init_process_group", "optim", "process_group_communicator", "stream"]
