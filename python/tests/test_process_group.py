"""gpucloud communicators over torch.distributed's gloo process groups (no MPI): every collective
against exact answers on 2 ranks under the real torchrun and on 4 ranks as 2 simulated nodes
(hierarchical all-reduce on split groups, gradient buckets, the cost model), a mismatched
collective as an error on every rank with the communicator still usable, and a rank that stops
calling: the others raise CommunicationError within the timeout and the job ends instead of
hanging. Interop configuration (Debian's torch)."""
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")

WORKER = r"""
import os, sys
import numpy as np
import torch, torch.distributed as dist
import gpucloud as gc, gpucloud.torch as gt

dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
comm = gt.process_group_communicator()
s = gc.Stream()
assert comm.backend == gc.CommBackend.transport and (comm.rank, comm.size) == (r, n)
local = int(os.environ.get("GPUCLOUD_LOCAL_SIZE", n))
assert comm.nodes == n // local and comm.local_size == local, (comm.nodes, comm.local_size)

x = np.arange(1000, dtype=np.float32) + r
want = np.arange(1000, dtype=np.float32) * n + n * (n - 1) / 2
flat, hier = np.empty_like(x), np.empty_like(x)
comm.all_reduce(x, flat, s)
comm.hierarchical_all_reduce(x, hier, s)
for dtype, tol in ((torch.float16, 0), (torch.bfloat16, 0)):
    t = torch.arange(16, dtype=dtype) * (r + 1)
    comm.all_reduce(t, t, s, op="average")
    s.synchronize()
    expect = (torch.arange(16, dtype=torch.float32) * sum(q + 1 for q in range(n)) / n).to(dtype)
    assert torch.equal(t, expect), (dtype, t, expect)
ints = np.full(7, r + 1, np.int64)
comm.all_reduce(ints, ints, s, op="max")
low = np.full(3, r + 1, np.int32)
comm.all_reduce(low, low, s, op="min")
gathered = np.empty(3 * n, np.int32)
comm.all_gather(np.full(3, r, np.int32), gathered, s)
shard = np.empty(4, np.float64)
comm.reduce_scatter(np.arange(4.0 * n), shard, s)
root = np.full(5, float(r))
comm.broadcast(root, n - 1, s)
comm.barrier(s)
s.synchronize()
assert np.array_equal(flat, want) and np.array_equal(hier, want), (flat[:4], hier[:4])
assert (ints == n).all() and (low == 1).all()
assert np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.int32), 3))
assert np.array_equal(shard, np.arange(4.0 * r, 4.0 * r + 4) * n), shard
assert (root == n - 1).all()

grads = [np.full(k, float(r + i), np.float32) for i, k in enumerate((10, 5000, 300, 70000))]
bucketer = gc.GradBucketer(comm, grads, first_bucket_bytes=1024, bucket_bytes=16384, hierarchical=comm.nodes > 1)
for i in reversed(range(len(grads))):
    bucketer.mark_ready(i, s)
bucketer.wait(s)
s.synchronize()
for i, g in enumerate(grads):
    assert np.allclose(g, np.mean([q + i for q in range(n)])), (i, g[:3])
model = comm.measure_cost_model(s)
assert model.nodes == comm.nodes

bad = np.zeros(4 + r, np.float32)  # the ranks disagree on the count
try:
    comm.all_reduce(bad, bad, s)
    s.synchronize()
    raise AssertionError("a mismatched all-reduce ran")
except gc.CommunicationError as e:
    assert "disagree" in str(e) and "count" in str(e), e
comm.all_reduce(x, flat, s)  # still usable
s.synchronize()
assert np.array_equal(flat, want)
print(f"rank {r}: process group communicator on {n} ranks ({comm.nodes} nodes): ok", flush=True)
"""


def _free_port():
    from ports import free_port

    return free_port()


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "SLURM_", "GPUCLOUD_LOCAL"))}
    env.update(extra)
    return env


def _finish(procs, timeout=240):
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(killed: timed out)")
    return outs


def test_every_collective_under_torchrun_over_gloo(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-r", "0:1,1:1", "-t", "0:1,1:1", "--log_dir", str(tmp_path / "logs"), str(script)]
    out = _finish([subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=_env())])[0]
    assert "rank 0: process group communicator on 2 ranks (1 nodes): ok" in out, out
    assert "rank 1: process group communicator on 2 ranks (1 nodes): ok" in out, out


def test_hierarchical_on_two_simulated_nodes_of_two(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(RANK=str(r), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), GPUCLOUD_LOCAL_SIZE="2"))
             for r in range(4)]
    outs = _finish(procs)
    for r, out in enumerate(outs):
        assert f"rank {r}: process group communicator on 4 ranks (2 nodes): ok" in out, "\n".join(outs)


STOPS = r"""
import os, sys, time
import numpy as np
import torch.distributed as dist
import gpucloud as gc, gpucloud.torch as gt

dist.init_process_group("gloo")
r = dist.get_rank()
comm = gt.process_group_communicator()
s = gc.Stream()
x = np.ones(4, np.float32)
comm.all_reduce(x, x, s)
s.synchronize()
if r == 1:
    time.sleep(60)  # stops calling collectives, still alive
    sys.exit(0)
start = time.monotonic()
try:
    comm.all_reduce(x, x, s)
    s.synchronize()
except gc.CommunicationError as e:
    print(f"rank 0 raised after {time.monotonic() - start:.1f} s: {e}", flush=True)
print("rank 0 broken:", comm.broken, flush=True)
"""


def test_a_rank_that_stops_is_a_communication_error_and_the_job_ends(tmp_path):
    script = tmp_path / "stops.py"
    script.write_text(STOPS)
    port = _free_port()
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                  MASTER_PORT=str(port), GPUCLOUD_COMM_TIMEOUT="2"))
             for r in range(2)]
    out0 = _finish(procs[:1], timeout=50)[0]
    took = time.monotonic() - start
    procs[1].kill()
    _finish(procs[1:])
    assert "rank 0 raised after" in out0 and "Communicator::all_reduce" in out0, out0
    assert "GPUCLOUD_COMM_TIMEOUT" in out0 and "rank 0 broken: True" in out0, out0
    assert procs[0].returncode != 0 and "gpucloud: ending the job" in out0, out0  # not a hang at exit
    assert took < 45, f"rank 0 took {took:.0f} s to end"
