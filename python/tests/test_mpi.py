import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("mpi_collectives.py")


def run_mpi(ranks, *args, local_size=None):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    if local_size:
        env["GPUCLOUD_LOCAL_SIZE"] = str(local_size)
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), sys.executable]
    result = subprocess.run(cmd + [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("ranks,local_size", [(2, None), (4, 2)])
def test_collectives_under_mpirun(ranks, local_size):
    result = run_mpi(ranks, local_size=local_size)
    nodes = ranks // local_size if local_size else 1
    assert f"python collectives on {ranks} ranks ({nodes} nodes): ok" in result.stdout


def test_communicator_from_mpi4py():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (Debian: python3-mpi4py)")
    result = run_mpi(3, "--mpi4py")
    assert "mpi4py communicators on 3 ranks: ok" in result.stdout
