import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("mpi_collectives.py")


def run_mpi(ranks, *args, local_size=None, hierarchy=None):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1")
    if local_size:
        env["GPUCLOUD_LOCAL_SIZE"] = str(local_size)
    if hierarchy:
        env["GPUCLOUD_HIERARCHY"] = str(hierarchy)
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), sys.executable]
    result = subprocess.run(cmd + [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("ranks,local_size", [(2, None), (4, 2)])
def test_collectives_under_mpirun(ranks, local_size):
    result = run_mpi(ranks, local_size=local_size)
    nodes = ranks // local_size if local_size else 1
    assert (f"python collectives on {ranks} ranks ({nodes} nodes): ok; "
            f"hierarchy node: {nodes} groups of {ranks // nodes}") in result.stdout, result.stdout


def test_the_hierarchy_splits_a_node_into_groups_of_local_ranks():
    result = run_mpi(4, hierarchy=2)
    assert "python collectives on 4 ranks (1 nodes): ok; hierarchy blocks of 2: 2 groups of 2" in result.stdout, \
        result.stdout


def test_communicator_from_mpi4py():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (Debian: python3-mpi4py)")
    result = run_mpi(3, "--mpi4py")
    assert "mpi4py communicators on 3 ranks: ok" in result.stdout


def test_communicator_from_a_finalised_mpi4py_is_an_error_not_an_abort():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (Debian: python3-mpi4py)")
    code = """
from mpi4py import MPI
import gpucloud as gc
comm = MPI.COMM_WORLD.Dup()
MPI.Finalize()
try:
    gc.Communicator.mpi(comm)
except gc.InvalidArgument as e:
    print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "refused: Communicator.mpi: comm: MPI is already finalised" in r.stdout, \
        r.stdout + r.stderr


def test_a_rank_that_never_joins_ends_the_job_after_the_timeout():
    """The survivor raises CommunicationError after the timeout, and the job then ends (the library
    aborts it at exit) instead of waiting in MPI_Finalize for the missing rank."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    code = """
import time, numpy as np, gpucloud as gc
c = gc.Communicator.mpi_world()
if c.rank == 1:
    time.sleep(120)        # never joins
s = gc.Stream()
x = np.ones(8, np.float32)
c.all_reduce(x, x, s)
try:
    s.synchronize()
except gc.CommunicationError as e:
    print("rank 0 raised:", "waited" in str(e), flush=True)
"""
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
               GPUCLOUD_COMM_TIMEOUT="1")
    import time
    start = time.monotonic()
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    took = time.monotonic() - start
    assert "rank 0 raised: True" in r.stdout, r.stdout + r.stderr
    assert r.returncode != 0 and "gpucloud: ending the job" in r.stderr, r.stdout + r.stderr
    assert took < 60, f"the job took {took:.0f} s to end"


@pytest.mark.parametrize("path", ["in_place", "worker"])
def test_the_arrays_of_a_collective_that_timed_out_are_kept_for_the_process_life(path):
    """A collective that timed out is abandoned with its messages left to MPI: a late peer still
    writes into its arrays. Dropped by the caller, they must stay allocated (a 2^31-byte broadcast
    that timed out segfaulted when its freed buffer was written), however large they are."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: openmpi-bin)")
    code = """
import gc as pygc, time, weakref, numpy as np, gpucloud as gc
c = gc.Communicator.mpi_world()
s = gc.Stream()
if c.rank == 1:
    time.sleep(30)        # joins long after rank 0 gave up
    raise SystemExit(0)
a = np.ones(1 << 20, np.float32)
if PATH == "worker":      # a busy stream: the collective goes to its worker
    gc.launch_host_func(s, lambda: time.sleep(0.2))
c.broadcast(a, 0, s)      # idle stream: run in place, polled by this thread
try:
    s.synchronize()
except gc.CommunicationError:
    pass
alive = weakref.ref(a)
del a
for _ in range(3):
    pygc.collect()
gc.Stream().synchronize()  # a binding call: finished borrows are released here
print("kept:", alive() is not None, flush=True)
"""
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_mpi_yield_when_idle="1",
               GPUCLOUD_COMM_TIMEOUT="1")
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                        sys.executable, "-c", f"PATH = {path!r}\n" + code], env=env, capture_output=True, text=True,
                       timeout=100)
    assert "kept: True" in r.stdout, r.stdout + r.stderr
    assert "Segmentation fault" not in r.stderr and "signal 11" not in r.stderr, r.stderr


def test_a_torchrun_worker_without_mpi_is_refused_not_made_rank_0_of_1():
    """torchrun sets RANK/WORLD_SIZE but starts no MPI job: mpi_world() says so instead of giving
    every worker a world of its own."""
    code = """
import gpucloud as gc
try:
    gc.Communicator.mpi_world()
except gc.InvalidArgument as e:
    print("refused:", e)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    env.update(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "refused:" in r.stdout, r.stdout + r.stderr
    assert "torchrun" in r.stdout and "4 processes but MPI's world has 1" in r.stdout and "WORLD_SIZE" in r.stdout


@pytest.mark.parametrize("per_node,task,want", [
    ("2(x2)", dict(SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_NODEID="1"), (3, 4, 1, 2, 1, 2, "srun")),
    ("3,1", dict(SLURM_PROCID="3", SLURM_LOCALID="0", SLURM_NODEID="1"), (3, 4, 0, 1, 1, 2, "srun")),
    ("3,1", dict(SLURM_PROCID="2", SLURM_LOCALID="2", SLURM_NODEID="0"), (2, 4, 2, 3, 0, 2, "srun")),
    ("2(x", dict(SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_NODEID="1"), "SLURM_STEP_TASKS_PER_NODE: '2(x'"),
])
def test_launch_info_reads_srun_step_layouts(per_node, task, want):
    """Slurm's compressed tasks-per-node lists as srun sets them (the forms seen on the test
    cluster): the node's size and index, or an InvalidArgument naming the variable."""
    code = """
import gpucloud as gc
try:
    l = gc.launch_info_from_environment()
    print("info", l.rank, l.size, l.local_rank, l.local_size, l.node, l.nodes, l.launcher, repr(l))
except gc.InvalidArgument as e:
    print("refused:", e)
"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "SLURM_", "GPUCLOUD_LOCAL_SIZE"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(SLURM_STEP_ID="0", SLURM_STEP_NUM_TASKS="4", SLURM_STEP_NUM_NODES="2",
               SLURM_STEP_TASKS_PER_NODE=per_node, **task)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    if isinstance(want, str):
        assert r.stdout.startswith("refused:") and want in r.stdout, r.stdout
    else:
        fields = r.stdout.split()
        assert tuple(int(x) for x in fields[1:7]) + (fields[7],) == want, r.stdout
        assert "LaunchInfo(rank=" in r.stdout and f"nodes={want[5]}" in r.stdout, r.stdout
