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

docs/checkpoint.md has the format and the guarantees. Paths are str, bytes or os.PathLike;
names that are not UTF-8 round-trip as os.fsdecode gives them.
"""

import collections
import warnings

from . import _core

from ._core import CHECKPOINT_FORMAT_VERSION as FORMAT_VERSION  # noqa: F401
from ._core import CheckpointError, CheckpointMismatch, Checkpointer, PendingSave  # noqa: F401
from ._core import CheckpointManifest as Manifest  # noqa: F401
from ._core import CheckpointTensorInfo as TensorInfo  # noqa: F401
from ._core import checkpoint_directory_name as directory_name  # noqa: F401
from ._core import checkpoint_load as load  # noqa: F401
from ._core import checkpoint_read_manifest as read_manifest  # noqa: F401

from ._core import CheckpointProgress as Progress  # noqa: F401


class CheckpointWarning(UserWarning):
    """latest() passed over a checkpoint that is damaged or incomplete (it says which and why)."""


LatestScan = collections.namedtuple("LatestScan", ["directory", "skipped"])
LatestScan.__doc__ = """find_latest()'s result: the newest valid checkpoint's directory (or None), and the
newer ones it skipped as [(directory, reason), ...], newest first."""


def find_latest(root):
    """The newest committed checkpoint under root whose manifest verifies and whose files are
    present, and every newer one that is not valid with the reason (no warning)."""
    directory, skipped = _core.checkpoint_find_latest(root)
    return LatestScan(directory, skipped)


def latest(root):
    """The newest valid committed checkpoint's directory under root, or None. A newer checkpoint
    that is damaged or incomplete is skipped with a CheckpointWarning saying why."""
    directory, skipped = _core.checkpoint_find_latest(root)
    for path, reason in skipped:
        warnings.warn(f"gpucloud.checkpoint.latest skips {path}: {reason}", CheckpointWarning, stacklevel=2)
    return directory


__all__ = [
    "FORMAT_VERSION",
    "CheckpointWarning",
    "LatestScan",
    "Progress",
    "find_latest",
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
