"""Python on a real Slurm cluster started here (scripts/slurm-cluster.sh: munged, slurmctld and a
slurmd per network-namespace node; srun starts the ranks through PMIx): `srun -n 2 python
examples/train_mlp.py`, the Python job script deploy/slurm/train_mlp_python_cpu.sbatch submitted and
resubmitted (it resumes), and communicators on mpi4py sub-communicators of a 2-node job that see
the nodes their own ranks live on.

One cluster per test run: these run where GPUCLOUD_SLURM_TESTS=1 (scripts/test.sh sets it in the
interop configuration, which has mpi4py); CTest's slurm_* tests cover the C++ side.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "slurm-cluster.sh"

pytestmark = pytest.mark.skipif(os.environ.get("GPUCLOUD_SLURM_TESTS") != "1",
                                reason="the Slurm cluster tests run in one configuration (GPUCLOUD_SLURM_TESTS=1: "
                                       "scripts/test.sh's interop)")


@pytest.fixture(scope="module")
def cluster():
    """The cluster's node count; stopped after the module's tests. Where Slurm cannot run here
    the reason fails the test (the configuration that asks for these tests must provide it)."""
    check = subprocess.run([CLUSTER, "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    netns = subprocess.run([ROOT / "scripts" / "netns-nodes.sh", "check"], capture_output=True, text=True)
    nodes = 2 if netns.returncode == 0 else 1
    up = subprocess.run([CLUSTER, "up", str(nodes)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield nodes
    finally:
        subprocess.run([CLUSTER, "down"], capture_output=True, timeout=120)


def slurm(*args, timeout=240, **env):
    """Runs a Slurm command against the cluster; stdout and stderr together."""
    r = subprocess.run([CLUSTER, "run", *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT, env=dict(os.environ, **env))
    return r.returncode, r.stdout + r.stderr


def test_srun_n2_python_train_mlp(cluster):
    rc, out = slurm("srun", "--mpi=pmix", "-n", "2", sys.executable, "examples/train_mlp.py",
                    "--steps", "60", "--log-every", "30")
    assert rc == 0, out
    assert "train_mlp.py: 2 rank(s) on host" in out and "final: loss" in out, out


def test_python_job_script_runs_and_resumes(cluster, tmp_path):
    nodes = cluster
    common = ["sbatch", "--wait", "-N", nodes, "--ntasks-per-node", 2 // nodes]
    env = dict(PYTHON=sys.executable, CHECKPOINT_DIR=str(tmp_path / "checkpoints"))
    script = ROOT / "deploy" / "slurm" / "train_mlp_python_cpu.sbatch"
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    rc, out = slurm(*common, "-o", first, script, "--steps", "60", "--checkpoint-every", "30", "--log-every", "30",
                    **env)
    log = first.read_text() if first.exists() else ""
    assert rc == 0, out + log
    assert f"2 task(s) on {nodes} node(s)" in log and "train_mlp.py: 2 rank(s)" in log, log
    assert "final: loss" in log, log
    assert (tmp_path / "checkpoints" / "step-000000000060" / "manifest.json").is_file(), log
    rc, out = slurm(*common, "-o", second, script, "--steps", "90", "--checkpoint-every", "30", "--log-every", "30",
                    **env)
    log = second.read_text() if second.exists() else ""
    assert rc == 0, out + log
    assert "at step 60 (written by 2 rank(s))" in log and "final: loss" in log, log


SUBCOMM = r"""
import socket
from mpi4py import MPI
import gpucloud as gc

launch = gc.launch_info_from_environment()
world = gc.Communicator.mpi_world()
host = socket.gethostname()
problems = []
if launch.launcher != "srun":
    problems.append(f"launcher {launch.launcher}")
if (launch.local_rank, launch.local_size, launch.node, launch.nodes) != (
        world.local_rank, world.local_size, world.node, world.nodes):
    problems.append(f"launch {launch} but the communicator has local {world.local_rank}/{world.local_size}, "
                    f"node {world.node}/{world.nodes}")
for name, color in (("data-parallel", launch.local_rank), ("node", launch.node)):
    sub = MPI.COMM_WORLD.Split(color, world.rank)
    group = gc.Communicator.mpi(sub)
    hosts = set(sub.allgather(host))
    if group.nodes != len(hosts) or group.size != sub.Get_size():
        problems.append(f"{name} group of {group.size} sees {group.nodes} node(s), its ranks live on {sorted(hosts)}")
    del group
    sub.Free()
print(f"rank {world.rank} on {host}: {launch}; problems: {problems}", flush=True)
ok = MPI.COMM_WORLD.allreduce(0 if problems else 1, op=MPI.MIN)
if world.rank == 0:
    print("SUBCOMM CHECK", "PASSED" if ok else "FAILED", flush=True)
"""


def test_sub_communicators_see_the_nodes_their_ranks_live_on(cluster, tmp_path):
    pytest.importorskip("mpi4py")  # the interop configuration has it
    script = tmp_path / "subcomm.py"
    script.write_text(SUBCOMM)
    nodes = cluster
    for layout in (["--ntasks-per-node", "2"], ["-n", "4"]):  # 2(x2), and 3,1 on nodes of 4 CPUs
        rc, out = slurm("srun", "--mpi=pmix", "-N", nodes, *layout, sys.executable, script)
        assert rc == 0 and "SUBCOMM CHECK PASSED" in out, out
        if nodes == 2:
            assert "nodes=2" in out, out
