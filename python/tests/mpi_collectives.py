"""Run under mpirun by test_mpi.py: collectives and gradient buckets from Python, on NumPy arrays."""
import sys

import numpy as np

import gpucloud as gc


def main():
    comm = gc.Communicator.mpi_world()
    s = gc.Stream()
    r, n = comm.rank, comm.size
    x = np.arange(1001, dtype=np.float32) * (r + 1)
    want = np.arange(1001, dtype=np.float32) * (n * (n + 1) / 2)
    flat, hier = np.empty_like(x), np.empty_like(x)
    comm.all_reduce(x, flat, s)
    comm.hierarchical_all_reduce(x, hier, s)
    ints = np.full(7, r + 1, np.int64)
    comm.all_reduce(ints, ints, s, op="max")
    gathered = np.empty(3 * n, np.int32)
    comm.all_gather(np.full(3, r, np.int32), gathered, s)
    s.synchronize()
    assert np.array_equal(flat, want) and np.array_equal(hier, want), (flat[:4], hier[:4])
    assert (ints == n).all()
    assert np.array_equal(gathered, np.repeat(np.arange(n, dtype=np.int32), 3))
    grads = [np.full(k, float(r + i), np.float32) for i, k in enumerate((10, 5000, 300, 70000))]
    bucketer = gc.GradBucketer(comm, grads, first_bucket_bytes=1024, bucket_bytes=16384)
    for i in reversed(range(len(grads))):
        bucketer.mark_ready(i, s)
    bucketer.wait(s)
    s.synchronize()
    for i, g in enumerate(grads):
        assert np.allclose(g, np.mean([q + i for q in range(n)])), (i, g[:3])
    model = comm.measure_cost_model(s)
    assert gc.AllReduceCostModel.from_json(model.to_json()).nodes == comm.hierarchy.groups  # nodes by default
    assert model.flat_halving == (n in (4, 8, 16) and comm.nodes > 1)  # MPI's flat form on several nodes
    auto = np.arange(100, dtype=np.int64) * (r + 1)
    comm.all_reduce_auto(auto, auto, s)
    s.synchronize()
    assert np.array_equal(auto, np.arange(100, dtype=np.int64) * (n * (n + 1) // 2))
    # A model whose predictions tie (no latency, one link speed): the first 6 calls of a size time
    # both forms, then every rank keeps the same one.
    tie = gc.AllReduceCostModel.from_json(model.to_json())
    tie.intra = tie.inter = gc.LinkCost(0.0, 1e-9)
    comm.set_cost_model(tie)
    chooses = comm.hierarchy.groups > 1 and comm.hierarchy.group_size > 1
    big = np.empty(40000, np.int64)
    assert tie.ties(big.nbytes)
    assert comm.all_reduce_auto_form(big.nbytes) == (gc.AllReduceForm.measuring if chooses else gc.AllReduceForm.flat)
    for call in range(7):
        big[:] = np.arange(big.size) * (r + 1) + call
        comm.all_reduce_auto(big, big, s)
        s.synchronize()
        assert np.array_equal(big, np.arange(big.size) * (n * (n + 1) // 2) + n * call), call
    form = comm.all_reduce_auto_form(big.nbytes)
    assert form != gc.AllReduceForm.measuring
    forms = np.zeros(n, np.int64)
    comm.all_gather(np.array([int(form)], np.int64), forms, s)
    s.synchronize()
    assert (forms == int(form)).all(), forms
    with np.testing.assert_raises(gc.InvalidArgument):
        comm.all_reduce(ints, ints, s, op="average")
    if r == 0:
        h = comm.hierarchy
        print(f"python collectives on {n} ranks ({comm.nodes} nodes): ok; "
              f"hierarchy {h.level}: {h.groups} groups of {h.group_size}")
    return 0


def from_mpi4py():
    """A gpucloud communicator over each half of an mpi4py split: even ranks and odd ranks."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    r, n = world.Get_rank(), world.Get_size()
    half = world.Split(r % 2, r)
    comm = gc.Communicator.mpi(half)
    assert (comm.rank, comm.size) == (half.Get_rank(), half.Get_size()), (comm.rank, comm.size)
    s = gc.Stream()
    x = np.full(1000, r, np.int64)
    comm.all_reduce(x, x, s)
    s.synchronize()
    assert (x == sum(range(r % 2, n, 2))).all(), x[:3]
    half.Free()  # gpucloud duplicated it: its communicator lives on
    y = np.ones(3, np.float32)
    comm.all_reduce(y, y, s)
    s.synchronize()
    assert (y == comm.size).all()
    with np.testing.assert_raises(gc.InvalidArgument):
        gc.Communicator.mpi("world")
    if gc.build_info().nccl:  # NCCL ids need a build with NCCL
        ids = world.allgather(gc.distributed.exchange_nccl_id_mpi(world))  # what nccl_from_mpi4py hands NCCL
        assert len(ids[0]) == 128 and all(i == ids[0] for i in ids), "every rank must get rank 0's id"
    world.Barrier()
    if r == 0:
        print(f"mpi4py communicators on {n} ranks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(from_mpi4py() if sys.argv[1:] == ["--mpi4py"] else main())
