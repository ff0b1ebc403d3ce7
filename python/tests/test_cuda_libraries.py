"""Where the package tells gpucloud's loader to find the CUDA libraries of the nvidia-* wheels:
their lib directories go into GPUCLOUD_CUDA_LIBRARY_PATH at import, after what the user set, and
nothing is loaded (a CPU-only program never opens them). Each case imports gpucloud in a fresh
interpreter with a stand-in site-packages/nvidia tree."""

import os
import subprocess
import sys

PRINT_PATH = "import os, gpucloud; print(os.environ.get('GPUCLOUD_CUDA_LIBRARY_PATH', '<unset>'))"


def _import_with(site, extra_env=None):
    env = dict(os.environ)
    env.pop("GPUCLOUD_CUDA_LIBRARY_PATH", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(site), env.get("PYTHONPATH", "")] if p)
    env.update(extra_env or {})
    out = subprocess.run([sys.executable, "-c", PRINT_PATH], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _wheel_tree(tmp_path, names):
    for name in names:
        (tmp_path / "nvidia" / name / "lib").mkdir(parents=True)
    (tmp_path / "nvidia" / "not_a_library").mkdir()  # no lib/: not listed
    return tmp_path


def test_the_wheels_lib_directories_are_published_after_the_users(tmp_path):
    site = _wheel_tree(tmp_path, ["cu13", "cudnn", "nccl"])
    published = _import_with(site, {"GPUCLOUD_CUDA_LIBRARY_PATH": "/opt/mine"}).split(os.pathsep)
    lib = [str(site / "nvidia" / n / "lib") for n in ("cu13", "cudnn", "nccl")]
    assert published[0] == "/opt/mine"
    for d in lib:
        assert d in published
    assert not any("not_a_library" in p for p in published)


def test_without_the_wheels_nothing_is_set(tmp_path):
    if _import_with(tmp_path) != "<unset>":
        # Another nvidia-* wheel is installed in this environment (torch brings them): its
        # directories are published, and none of them is under tmp_path.
        assert str(tmp_path) not in _import_with(tmp_path)


def test_no_cuda_library_is_loaded_at_import(tmp_path):
    code = (
        "import gpucloud\n"
        "maps = open('/proc/self/maps').read()\n"
        "print([n for n in ('libcublasLt', 'libcudnn', 'libnccl') if n in maps])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
