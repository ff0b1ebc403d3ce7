"""Preemption and restarts seen from inside a training job (docs/fault-tolerance.md).

``JobControl`` turns SIGTERM / SIGUSR1 (a cloud's preemption notice, Slurm's ``--signal``,
``gpucloud-run`` passing one on) into a stop that every rank agrees on at the same step, says which
restart this launch is and why, and beats the heartbeat ``gpucloud-run`` watches. ``State`` keeps
what a checkpoint of the job holds (model, optimizer, scaler, data position) in one place, like
Horovod Elastic's ``State`` or torch's ``Stateful``:

    control = gpucloud.elastic.JobControl()
    state = gpucloud.elastic.State("ckpt", comm=comm, every=500)
    state.register("model", {"w1": w1, "b1": b1})     # arrays: views of the live state
    state.register("optimizer", adam)                 # state_dict() / load_state_dict(d, stream)
    state.register("scaler", scaler)
    start = state.restore(stream)                     # the newest valid checkpoint's step, or 0
    for step in range(start, steps):
        ...                                           # the step's work on stream
        if state.end_step(step + 1, stream, control):  # periodic saves; True: saved, stop now
            sys.exit(gpucloud.elastic.PREEMPTED_EXIT_CODE)
    state.close()
"""

from . import checkpoint as _checkpoint
from ._core import PREEMPTED_EXIT_CODE, JobControl, RestartInfo, restart_info_from_environment  # noqa: F401

__all__ = ["PREEMPTED_EXIT_CODE", "JobControl", "RestartInfo", "restart_info_from_environment", "State"]


class State:
    """What a checkpoint of the job holds, registered by name, saved every ``every`` steps in the
    background and at a stop, restored from the newest valid checkpoint of ``root``."""

    def __init__(self, root, *, comm=None, every=500, keep_last=3, metadata=None):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"every: {every!r} must be an int of at least 1 (steps between saves)")
        self._root = root
        self._comm = comm
        self._every = every
        self._metadata = dict(metadata or {})
        self._parts = {}
        self._checkpointer = _checkpoint.Checkpointer(root, keep_last=keep_last, comm=comm)
        self._last_saved = -1

    def register(self, name, part):
        """Adds ``part`` under ``name``: a dict of arrays (saved as they are), or an object with
        ``state_dict()`` and ``load_state_dict(state, stream)`` (gpucloud's optimizers and scaler)."""
        if not isinstance(name, str) or not name or "." in name:
            raise ValueError(f"name: {name!r} must be a non-empty str without '.'")
        if name in self._parts:
            raise ValueError(f"name: {name!r} is registered already")
        if not isinstance(part, dict) and not (hasattr(part, "state_dict") and hasattr(part, "load_state_dict")):
            raise TypeError(f"part {name!r}: a dict of arrays, or an object with state_dict() and "
                            f"load_state_dict(state, stream); got {type(part).__name__}")
        self._parts[name] = part

    def _flat(self):
        flat = {}
        for name, part in self._parts.items():
            entries = part if isinstance(part, dict) else part.state_dict()
            flat.update({f"{name}.{key}": value for key, value in entries.items()})
        return flat

    def restore(self, stream, *, verify="before_writing"):
        """Loads the newest valid checkpoint of the root into the registered state (verified;
        any world size); returns its step, or 0 when there is none yet. ``verify``: as
        gpucloud.checkpoint.load's ("while_copying": one read of the data, not two)."""
        latest = _checkpoint.latest(self._root)
        if latest is None:
            return 0
        flat = self._flat()
        manifest = _checkpoint.load(latest, flat, stream, verify=verify)
        for name, part in self._parts.items():
            if not isinstance(part, dict):
                prefix = name + "."
                part.load_state_dict({k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}, stream)
        self._last_saved = manifest.step
        return manifest.step

    def save(self, step, stream, *, wait=False):
        """Snapshots the state after ``step`` steps and writes it in the background (``wait``:
        until committed). Returns the PendingSave."""
        pending = self._checkpointer.save_async(step, self._flat(), stream, metadata=self._metadata)
        self._last_saved = step
        if wait:
            pending.wait()
        return pending

    def end_step(self, step, stream, control=None):
        """After ``step`` steps' work is enqueued: a background save every ``every`` steps; with
        ``control``, its agreed stop (a collective over ``comm``): then the state of ``step`` is
        committed before this returns True, and the caller exits with PREEMPTED_EXIT_CODE."""
        if step % self._every == 0:
            self.save(step, stream)
        if control is None or not control.should_stop(step, self._comm, stream if self._comm else None):
            return False
        self._checkpointer.wait()
        if self._last_saved != step:
            self.save(step, stream, wait=True)
        return True

    def close(self):
        """Waits for the save in flight (its error is raised here)."""
        self._checkpointer.wait()
