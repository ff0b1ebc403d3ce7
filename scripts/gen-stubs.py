#!/usr/bin/env python3
"""Regenerates python/gpucloud/_core.pyi from the installed extension (pip install . first).

Runs pybind11-stubgen, then fixes what it gets wrong for this module: our Buffer class is not
typing_extensions.Buffer, capsules are plain objects, and the exception types (created with the
C API) are declared here with their real bases. python/tests/test_stubs.py checks the result
against the module, so a binding added without regenerating fails the tests.
"""
import pathlib
import re
import subprocess
import sys
import tempfile

EXCEPTIONS = '''class Error(RuntimeError):
    """Base of every gpucloud error."""
class InvalidArgument(Error, ValueError):
    """A bad argument; nothing was changed."""
class OutOfMemory(Error, MemoryError):
    """An allocation failed; recoverable."""
class DeviceError(Error):
    """A device or runtime failure."""
class CommunicationError(Error):
    """A collective failed, timed out or a peer died."""
class Unsupported(Error, NotImplementedError):
    """Not available in this build or on this device."""
class CheckpointError(Error):
    """A checkpoint cannot be written or read (I/O, truncation, checksum)."""
class CheckpointMismatch(CheckpointError, ValueError):
    """A sound checkpoint that does not fit what it is loaded into; nothing was written."""
'''


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "pybind11_stubgen", "gpucloud._core", "-o", out], check=True)
        text = (pathlib.Path(out) / "gpucloud" / "_core.pyi").read_text()
    text = text.replace("typing_extensions.Buffer", "Buffer").replace("typing_extensions.CapsuleType", "typing.Any")
    text = re.sub(r"^import typing_extensions\n", "", text, flags=re.M)
    text = re.sub(r"^from gpucloud import \w+\n", "", text, flags=re.M)
    text = text.replace("import typing\n", "import typing\n" + EXCEPTIONS, 1)
    (root / "python" / "gpucloud" / "_core.pyi").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
