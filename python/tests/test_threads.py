"""The host thread budget (gc.host_threads): the CPUs the process may use under taskset and under
a real cgroup CPU quota (a cgroup this test makes, its child moved into it), the library's pool and
OpenBLAS's count following it, the one knob (GPUCLOUD_HOST_THREADS), OpenBLAS's own variable
respected, and gpucloud.torch capping torch's intra-op threads at the budget. Each case in a fresh
process: the budget is read once."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import gpucloud as gc
from cgroups import cgroup  # noqa: E402

REPORT = """
    import gpucloud as gc
    t = gc.host_threads()
    print(t.cpus, t.pool, t.blas, "|", t.reason)
"""
BLAS = gc.host_threads().blas > 0  # built with OpenBLAS (not the python-asan configuration)


def run(body, env=None, prefix=()):
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GPUCLOUD_HOST_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=120, env=dict(clean, **(env or {})))
    assert r.returncode == 0, r.stderr
    return r.stdout


def figures(out):
    cpus, pool, blas = (int(v) for v in out.split("|")[0].split())
    return cpus, pool, blas, out.split("|")[1].strip()


def test_the_budget_is_the_cpus_of_the_affinity_mask():
    cpus, pool, blas, reason = figures(run(REPORT))
    assert cpus == pool == len(os.sched_getaffinity(0)), reason
    assert blas == (cpus if BLAS else 0)
    assert reason.startswith(f"affinity {cpus} of {os.cpu_count()} cores"), reason


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) is not installed")
def test_under_taskset_the_pool_and_openblas_get_one_thread():
    cpus, pool, blas, reason = figures(run(REPORT, prefix=("taskset", "-c", "0")))
    assert (cpus, pool, blas) == (1, 1, 1 if BLAS else 0), reason
    assert reason.startswith(f"affinity 1 of {os.cpu_count()} cores"), reason


def test_the_one_knob_and_openblas_own_variable():
    cpus, pool, blas, reason = figures(run(REPORT, env={"GPUCLOUD_HOST_THREADS": "3"}))
    assert (pool, blas) == (3, 3 if BLAS else 0) and "GPUCLOUD_HOST_THREADS=3" in reason, reason
    cpus, pool, blas, reason = figures(run(REPORT, env={"GPUCLOUD_HOST_THREADS": "3", "OPENBLAS_NUM_THREADS": "1"}))
    assert (pool, blas) == (3, 1 if BLAS else 0), reason  # OpenBLAS's own variable is the user's word


@pytest.mark.parametrize("quota_us, expected", [(100000, 1), (50000, 1)])
def test_a_cgroup_cpu_quota_caps_the_budget(quota_us, expected):
    limits = {"cpu.max": f"{quota_us} 100000", "cpu.cfs_period_us": 100000, "cpu.cfs_quota_us": quota_us}
    with cgroup("cpu", limits) as enter:
        cpus, pool, blas, reason = figures(run(enter + textwrap.dedent(REPORT)))
        assert (cpus, pool, blas) == (expected, expected, expected if BLAS else 0), reason
        assert f"cgroup quota {quota_us / 100000:.2f} CPUs" in reason, reason
        torch_check = """
            import torch
            torch.set_num_threads(2)  # what torch starts with on a machine of 2 cores: the quota caps it
            import gpucloud.torch
            print(torch.get_num_threads())
        """
        if _has_torch():
            assert run(enter + textwrap.dedent(torch_check)).split() == [str(expected)]


def _has_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_torch(), reason="PyTorch is not installed (Debian: python3-torch)")
def test_gpucloud_torch_sets_torchs_threads_beside_the_budget_unless_omp_num_threads_is_set():
    body = """
        import torch
        torch.set_num_threads(8)  # torch's own default on an 8-core node
        import gpucloud as gc, gpucloud.torch
        print(torch.get_num_threads(), gc.host_threads().pool, gpucloud.torch._torch_blas_beside_openmp(),
              "BLAS_INFO=mkl" in torch.__config__.show())
    """
    threads, budget, beside, mkl = run(body).split()
    if "BLAS_INFO=generic" in _torch_config():  # Debian's torch (CI's interop): products on OpenBLAS
        assert beside == "True"
    if mkl == "True":  # PyPI's: MKL shares torch's OpenMP team
        assert beside == "False"
    expected = 1 if beside == "True" and int(budget) > 1 else int(budget)
    assert int(threads) == expected, (threads, budget, beside)
    threads, _, _, _ = run(body, env={"OMP_NUM_THREADS": "8"}).split()
    assert threads == "8"  # the user's word
    threads, _, _, _ = run(body, env={"GPUCLOUD_HOST_THREADS": "1"}).split()
    assert threads == "1"


def _torch_config():
    import torch
    return torch.__config__.show()
