#!/usr/bin/env python3
"""gpucloud's all-reduce over a torch.distributed gloo group (gpucloud.torch.process_group_communicator)
against gloo's own all-reduce on the same kind of group, in the same job, interleaved round by round.

    python3 bench/bench_process_group.py [--ranks 2] [--rounds 7] [--iters 20]

Starts RANKS worker processes on loopback (as torchrun would: RANK, WORLD_SIZE, MASTER_ADDR/PORT),
each with init_process_group("gloo"). Per size and round: ITERS torch.distributed.all_reduce calls
on a gloo group, then ITERS gpucloud all_reduce calls (each waited for: stream.synchronize()), on
float32 tensors. Prints per size the median over rounds of raw µs, gpucloud µs, their ratio (raw /
gpucloud: above 1 gpucloud is faster) and the overhead in µs. gpucloud's cost over raw gloo is its
agreement (one small gloo all-reduce per collective: the ranks state what they run) and the hand-off
to its stream's worker. Needs torch (the interop configuration: Debian's python3-torch).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

SIZES = [8, 4096, 65536, 1 << 20, 16 << 20]


def worker(rounds, iters):
    import torch
    import torch.distributed as dist

    import gpucloud as gc
    import gpucloud.torch as gt

    dist.init_process_group("gloo")
    raw_group = dist.new_group(backend="gloo")
    comm = gt.process_group_communicator()
    s = gc.Stream()
    rank = dist.get_rank()
    for size in SIZES:
        x = torch.ones(max(size // 4, 1))
        raw_times, ours = [], []
        for _ in range(rounds):
            dist.barrier(raw_group)
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x, group=raw_group)
            raw_times.append((time.perf_counter() - t0) / iters * 1e6)
            dist.barrier(raw_group)
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.all_reduce(x, x, s)
                s.synchronize()
            ours.append((time.perf_counter() - t0) / iters * 1e6)
        if rank == 0:
            raw_us, our_us = statistics.median(raw_times), statistics.median(ours)
            ratios = [a / b for a, b in zip(raw_times, ours)]
            print(f"| {size} | {raw_us:.0f} | {our_us:.0f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) | {our_us - raw_us:.0f} |", flush=True)
    dist.barrier()  # every rank is done with the group before it ends
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.rounds, a.iters)
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    print(f"all-reduce of float32 on {a.ranks} ranks over gloo (loopback), medians of {a.rounds} rounds "
          f"of {a.iters} calls")
    print("| bytes | gloo µs | gpucloud µs | gloo / gpucloud (min-max) | overhead µs |")
    print("|---|---|---|---|---|")
    procs = []
    for r in range(a.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--rounds", str(a.rounds), "--iters",
                                       str(a.iters)], env=env))
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
