"""Checkpoints: asynchronous, atomic, sharded across ranks, loadable on any number of ranks.

A checkpoint is the directory ``root/step-NNNNNNNNNNNN``: one safetensors file per writing rank
(``safetensors.numpy.load_file`` and ``safetensors.torch.load_file`` open them without gpucloud)
and ``manifest.json`` (format version, step, world size, every tensor's dtype, shape, file, byte
range and XXH3-64 checksum, and your metadata). It appears under that name only once complete.

    ck = gpucloud.checkpoint.Checkpointer("ckpt", keep_last=3, comm=comm)
    state = {"model.w": w, **{"opt." + k: v for k, v in adam.state_dict().items()}}
    pending = ck.save_async(step, state, stream, metadata={"loader": json.dumps(pos)})
    ...                                          # training goes on while it writes
    pending.wait()                               # or ck.wait(); errors surface here

    latest = gpucloud.checkpoint.latest("ckpt")
    manifest = gpucloud.checkpoint.load(latest, state, stream)   # verified, then copied in
    adam.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("opt.")}, stream)

docs/checkpoint.md has the format and the guarantees.
"""

from ._core import CHECKPOINT_FORMAT_VERSION as FORMAT_VERSION  # noqa: F401
from ._core import CheckpointError, CheckpointMismatch, Checkpointer, PendingSave  # noqa: F401
from ._core import CheckpointManifest as Manifest  # noqa: F401
from ._core import CheckpointTensorInfo as TensorInfo  # noqa: F401
from ._core import checkpoint_directory_name as directory_name  # noqa: F401
from ._core import checkpoint_latest as latest  # noqa: F401
from ._core import checkpoint_load as load  # noqa: F401
from ._core import checkpoint_read_manifest as read_manifest  # noqa: F401

__all__ = [
    "FORMAT_VERSION",
    "Checkpointer",
    "CheckpointError",
    "CheckpointMismatch",
    "Manifest",
    "PendingSave",
    "TensorInfo",
    "directory_name",
    "latest",
    "load",
    "read_manifest",
]
