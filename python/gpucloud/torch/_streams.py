"""Which gpucloud stream a torch tensor's work runs on (internal).

On a GPU: the framework's current stream, adopted (gpucloud work is ordered with torch's, no
synchronize() in user code). On the CPU: one host stream per process, and every drop-in call
waits for its work before it returns, as torch's CPU operations do.
"""
import threading

import torch

import gpucloud as _gc

_lock = threading.Lock()
_host_stream = None


def stream_for(device: torch.device):
    """The gpucloud stream for work on tensors of ``device``."""
    global _host_stream
    if device.type == "cuda":
        return _gc.Stream(torch.cuda.current_stream(device))
    if device.type != "cpu":
        raise _gc.InvalidArgument(f"device: {device} is neither a CUDA device nor the CPU")
    with _lock:
        if _host_stream is None:
            _host_stream = _gc.Stream(_gc.Device("host"))
        return _host_stream


def finish(stream, device: torch.device) -> None:
    """Waits for ``stream`` on the CPU (torch's CPU calls return done); on a GPU the work stays queued."""
    if device.type == "cpu":
        stream.synchronize()


def gc_device(device: torch.device):
    """The gpucloud Device of a torch device."""
    if device.type == "cuda":
        return _gc.Device(f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}")
    return _gc.Device("host")
