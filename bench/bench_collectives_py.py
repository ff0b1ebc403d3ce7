#!/usr/bin/env python3
"""gpucloud's MPI all-reduce from Python against mpi4py's Allreduce and torch.distributed's gloo
all_reduce, in the same job on the same NumPy/torch memory, interleaved call by call.

    mpirun -np 2 python bench/bench_collectives_py.py [--sizes 8,4096,1048576,67108864] [--calls 200]

For every size (bytes of float32), each round times one call of each peer in turn, in place, each
the slowest rank's time (gpucloud: comm.all_reduce on a host stream, then stream.synchronize()).
Prints the median µs per call of each and the ratios peer / gpucloud (above 1: gpucloud is
faster). mpi4py and torch are optional: a peer that does not import is left out. Run it with the
interop configuration's Python (Debian's python3-mpi4py and python3-torch).
"""
import argparse
import contextlib
import statistics
import time

import numpy as np

import gpucloud as gc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8,4096,1048576,67108864")
    ap.add_argument("--calls", type=int, default=200, help="calls per peer at the smallest size")
    args = ap.parse_args()

    comm = gc.Communicator.mpi_world()
    stream = gc.Stream()
    peers = {}
    try:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        peers["mpi4py"] = lambda a: world.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        barrier = world.Barrier
    except ImportError:
        world = None
        barrier = None
    try:
        import socket

        import torch
        import torch.distributed as dist

        port = np.zeros(1, np.int64)
        if comm.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port[0] = s.getsockname()[1]
        comm.broadcast(port, 0, stream)
        stream.synchronize()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}", rank=comm.rank,
                                world_size=comm.size)
        import gpucloud.torch as gt

        # Each size's array as a tensor, made untimed before its calls: settled() then waits, once
        # per size, until gloo has let go of it (torch 2 aborts at exit otherwise).
        gloo_tensor = {}
        peers["gloo"] = lambda a: dist.all_reduce(gloo_tensor[id(a)])
    except ImportError:
        torch = None

    def ours(a):
        comm.all_reduce(a, a, stream)
        stream.synchronize()

    def slowest(seconds):
        t = np.array([seconds])
        comm.all_reduce(t, t, stream, op="max")
        stream.synchronize()
        return float(t[0])

    sides = {"gpucloud": ours, **peers}
    if comm.rank == 0:
        print(f"all-reduce (sum, in place, float32) on {comm.size} ranks, {comm.nodes} node(s); µs per call, "
              f"median of interleaved calls; ratio = peer / gpucloud (above 1: gpucloud is faster)")
    for size in (int(x) for x in args.sizes.split(",")):
        n = max(1, size // 4)
        calls = max(10, min(args.calls, args.calls * 65536 // size))
        arrays = {name: np.ones(n, np.float32) for name in sides}
        settled = contextlib.nullcontext()
        if "gloo" in sides:
            gloo_tensor = {id(arrays["gloo"]): torch.from_numpy(arrays["gloo"])}
            settled = gt.settled(*gloo_tensor.values())
        with settled:
            for name, f in sides.items():  # warm-up
                f(arrays[name])
            times = {name: [] for name in sides}
            order = list(sides)
            for i in range(calls):
                for name in (order if i % 2 == 0 else order[::-1]):
                    arrays[name].fill(1.0)
                    if barrier:
                        barrier()
                    start = time.perf_counter()
                    sides[name](arrays[name])
                    times[name].append(slowest(time.perf_counter() - start))
        for name in sides:  # every side summed the same ones
            assert np.all(arrays[name] == comm.size), name
        if comm.rank == 0:
            med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            ratios = ", ".join(f"{name} / gpucloud {med[name] / med['gpucloud']:.2f}" for name in peers)
            cells = ", ".join(f"{name} {med[name]:.1f}" for name in sides)
            print(f"{size:>10} B ({calls} calls): {cells}; {ratios}", flush=True)
    if torch is not None:
        dist.barrier()  # every rank is done with the group before it ends
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
