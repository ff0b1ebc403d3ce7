"""Where the CUDA libraries of the nvidia-* wheels are, for gpucloud's run-time loading.

gpucloud loads cuBLASLt, cuDNN and NCCL when a GPU first needs them (docs/building.md). Installed
as wheels (``pip install 'gpucloud[cuda13]'``: nvidia-cublas, nvidia-cudnn-cu13, nvidia-nccl-cu13)
they live under site-packages/nvidia/*/lib, where the dynamic loader does not look: at import,
those directories are appended to GPUCLOUD_CUDA_LIBRARY_PATH, which the loader searches after its
own paths. Nothing is loaded here: a CPU-only program never opens them.
"""

import glob
import os
import sys

VARIABLE = "GPUCLOUD_CUDA_LIBRARY_PATH"


def wheel_library_dirs():
    """The lib directories of the installed nvidia-* wheels (an empty list without any), in the
    order of sys.path. Every path entry's nvidia/ is read, not the ``nvidia`` package's __path__:
    some wheels (the CUDA 12 ones torch 2 brings) ship nvidia/__init__.py, and a regular package
    hides the other entries' nvidia/ directories from the import system."""
    dirs = []
    for entry in sys.path:
        root = os.path.join(os.path.abspath(entry or os.curdir), "nvidia")
        if not os.path.isdir(root):
            continue
        for lib in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            if os.path.isdir(lib) and lib not in dirs:
                dirs.append(lib)
    return dirs


def publish_wheel_library_dirs():
    """Appends the wheels' lib directories to GPUCLOUD_CUDA_LIBRARY_PATH (those not there yet)."""
    current = [d for d in os.environ.get(VARIABLE, "").split(os.pathsep) if d]
    added = [d for d in wheel_library_dirs() if d not in current]
    if added:
        os.environ[VARIABLE] = os.pathsep.join(current + added)
    return added
