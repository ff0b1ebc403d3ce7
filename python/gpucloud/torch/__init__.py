"""PyTorch drop-ins over gpucloud (imports torch; ``import gpucloud`` alone never does).

- ``gpucloud.torch.GradScaler``: ``torch.cuda.amp.GradScaler``'s API, defaults, rule and state dict;
  with gpucloud's optimizers an overflow step is skipped on the device (no host sync per step).
- ``gpucloud.torch.optim.AdamW`` / ``Adam`` / ``SGD``: ``torch.optim.Optimizer`` subclasses over the
  fused multi-tensor kernels, state dicts interchangeable with torch's own.
- ``gpucloud.torch.ddp``: communication hooks for ``DistributedDataParallel.register_comm_hook``.
- ``DistributedOptimizer``, ``broadcast_parameters``, ``broadcast_optimizer_state``: Horovod's API.
- ``process_group_communicator()``: a gpucloud communicator over the job's ``torch.distributed``
  (gloo) process group, for jobs without MPI (torchrun on CPUs); ``init_process_group(comm)``:
  torch's process group for a job mpirun or srun started, its rendezvous over ``comm``;
  ``settled(tensors)``: returns once gloo's worker threads let go of a collective's tensors (torch 2
  can abort at exit otherwise).
- ``Checkpointer``: checkpoints of a torch job's whole state (model, optimizer, scaler, scheduler,
  your own), one call each way: ``save_async(step, state)``, ``load(state)``.
- ``stream(device)``: the gpucloud stream the drop-ins use for tensors on ``device``: the stream to
  give ``gpucloud.elastic.JobControl.should_stop`` and other collectives of the same communicator.

Importing it sets torch's intra-op threads beside gpucloud's host thread budget
(``gpucloud.host_threads().pool``: the CPUs the process's affinity and cgroup CPU quota allow, or
``GPUCLOUD_HOST_THREADS``) unless ``OMP_NUM_THREADS`` is set: at most the budget (torch counts the
machine's cores, blind to a container's quota), and 1 where torch's matrix products run on
OpenBLAS beside its OpenMP team (they keep the budget's cores there; two spinning teams on the same
cores halve a step's speed). ``torch.set_num_threads`` afterwards wins.

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
from .process_group import ProcessGroupTransport, init_process_group, process_group_communicator, settled  # noqa: F401


def _torch_blas_beside_openmp():
    """Whether torch's matrix products run on a BLAS with its own thread pool (OpenBLAS, a generic
    libblas) beside torch's OpenMP team, as in Debian's and conda-forge's OpenBLAS builds; MKL
    builds share the OpenMP team."""
    config = _torch.__config__.show()
    return "USE_OPENMP=ON" in config and any(f"BLAS_INFO={b}" in config for b in ("generic", "open"))


def _coordinate_threads():
    """torch's intra-op threads beside gpucloud's budget (docs/tuning.md, "Host threads")."""
    import os

    import gpucloud as _gc
    if "OMP_NUM_THREADS" in os.environ:
        return  # the user's word
    budget = _gc.host_threads().pool
    # Two teams that spin while waiting (OpenMP's and OpenBLAS's) on the same cores take turns
    # badly (2 cores: 58-64 ms a step instead of 30): torch's own threads go to 1 and its matrix
    # products keep the budget's cores through OpenBLAS.
    wanted = 1 if budget > 1 and _torch_blas_beside_openmp() else budget
    if _torch.get_num_threads() > wanted:
        _torch.set_num_threads(wanted)


_coordinate_threads()


def stream(device="cpu"):
    """The gpucloud stream the drop-ins run their work on for tensors on ``device`` (a
    ``torch.device`` or its name): torch's current stream on a GPU, the process's host stream on
    the CPU. Collectives must reach a communicator in the same order on every rank: give this
    stream to ``JobControl.should_stop`` (or any collective of your own on the communicator the
    hooks use), so it is ordered with the gradient all-reduces."""
    return _stream_for(_torch.device(device))


__all__ = ["Checkpointer", "DistributedOptimizer", "GradScaler", "ProcessGroupTransport", "broadcast_optimizer_state",
           "broadcast_parameters", "ddp", "init_process_group", "optim", "process_group_communicator", "settled",
           "stream"]
