#!/usr/bin/env python3
"""gpucloud.torch's drop-ins against torch's own, in the same process, interleaved round by round.

    bench_torch_dropins.py optimizer [--kind adamw|sgd] [--params 64] [--mib 64] [--steps 20] [--rounds 7]
                                     [--threads N]
    mpirun -np 2 bench_torch_dropins.py hook [--mib 16] [--steps 20] [--rounds 7]

optimizer: the time of opt.step() for gpucloud.torch.optim.AdamW (one fused multi-tensor pass)
and torch.optim.AdamW with foreach=True and with its for-loop path (the ratio is to the faster of
the two in each round), or SGD with momentum, over the same parameters and gradients, the three
in rotating order, their parameters compared at the end; --threads N gives both sides N threads
(torch.set_num_threads,
GPUCLOUD_HOST_THREADS; default: each library's own default). hook: a DDP step (backward with its bucket all-reduces) with gpucloud's
allreduce_hook and with DDP's default all-reduce over gloo. Prints each round and the median of
torch_time / gpucloud_time (above 1: gpucloud is faster). Needs torch (the interop configuration).
"""
import argparse
import os
import statistics
import sys
import time

import torch

import gpucloud as gc
import gpucloud.torch as gt


def report(name, ratios, extra=""):
    med = statistics.median(ratios)
    print(f"{name}: torch / gpucloud, median of {len(ratios)} rounds: {med:.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}){extra}", flush=True)
    return med


def bench_optimizer(args):
    numel = args.mib * (1 << 20) // 4
    sizes = [max(1, numel * (i + 1) * 2 // (args.params * (args.params + 1))) for i in range(args.params)]
    g = torch.Generator().manual_seed(0)
    values = [(torch.randn(n, generator=g) * 0.01, torch.randn(n, generator=g) * 0.01) for n in sizes]

    def make():  # every side the same parameters and gradients
        params = [torch.nn.Parameter(w.clone()) for w, _ in values]
        for p, (_, grad) in zip(params, values):
            p.grad = grad.clone()
        return params

    # torch's two CPU paths: foreach=True (multi-tensor) and the for-loop one, often the faster
    # on CPUs; the comparison is with whichever is faster in each round.
    if args.kind == "adamw":
        sides = {"torch foreach": torch.optim.AdamW(make(), 1e-3, foreach=True),
                 "torch for-loop": torch.optim.AdamW(make(), 1e-3, foreach=False),
                 "gpucloud": gt.optim.AdamW(make(), 1e-3)}
    else:
        sides = {"torch foreach": torch.optim.SGD(make(), 1e-3, momentum=0.9, foreach=True),
                 "torch for-loop": torch.optim.SGD(make(), 1e-3, momentum=0.9, foreach=False),
                 "gpucloud": gt.optim.SGD(make(), 1e-3, momentum=0.9)}
    for opt in sides.values():  # warm-up: state allocated, fused optimizer built
        opt.step()
    print(f"{'AdamW' if args.kind == 'adamw' else 'SGD (momentum)'} step over {args.params} tensors, "
          f"{sum(sizes) * 4 / (1 << 20):.1f} MiB of fp32 parameters, torch {torch.__version__} (foreach=True and "
          f"for-loop), {torch.get_num_threads()} torch threads, "
          f"GPUCLOUD_HOST_THREADS={os.environ.get('GPUCLOUD_HOST_THREADS', 'unset (the cores)')}, "
          f"load average {os.getloadavg()[0]:.2f}")
    names = list(sides)
    ratios, fastest = [], []
    for r in range(args.rounds):
        t = {}
        for name in names[r % 3:] + names[:r % 3]:
            start = time.perf_counter()
            for _ in range(args.steps):
                sides[name].step()
            t[name] = (time.perf_counter() - start) / args.steps
        peer = min(("torch foreach", "torch for-loop"), key=t.get)
        fastest.append(peer)
        ratios.append(t[peer] / t["gpucloud"])
        print(f"round {r}: " + ", ".join(f"{n} {t[n] * 1e3:.2f} ms" for n in names) +
              f" per step; ratio to {peer} {ratios[-1]:.2f}", flush=True)
    # Every side took the same steps on the same values: the same parameters (fp32 arithmetic in
    # another order: to rounding).
    reference = sides["torch for-loop"].param_groups[0]["params"]
    for name in ("torch foreach", "gpucloud"):
        for a, b in zip(sides[name].param_groups[0]["params"], reference):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    report("optimizer step", ratios, f"; torch's faster path: {max(set(fastest), key=fastest.count)} "
           f"in {max(fastest.count(f) for f in set(fastest))} of {len(fastest)} rounds; results equal")


def bench_hook(args):
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    comm = gc.Communicator.mpi_world()
    port = torch.zeros(1, dtype=torch.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    stream = gc.Stream()
    comm.broadcast(port, 0, stream)
    stream.synchronize()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port[0])}", rank=comm.rank,
                            world_size=comm.size)
    width = int((args.mib * (1 << 20) / 4 / 4) ** 0.5)  # four square layers of args.mib MiB in all

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])

    sides = {"torch": DDP(model()), "gpucloud": DDP(model())}
    sides["gpucloud"].register_comm_hook(gt.ddp.HookState(comm), gt.ddp.allreduce_hook)
    x = torch.randn(8, width)

    def step(m):
        m.zero_grad(set_to_none=True)
        m(x).square().mean().backward()

    for m in sides.values():
        step(m)
    if comm.rank == 0:
        print(f"DDP backward + gradient all-reduce, {comm.size} ranks, {args.mib} MiB of fp32 gradients "
              f"(4 layers of {width}x{width}), torch {torch.__version__}")
    ratios = []
    for r in range(args.rounds):
        t = {}
        for name in (["torch", "gpucloud"] if r % 2 == 0 else ["gpucloud", "torch"]):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(sides[name])
            t[name] = (time.perf_counter() - start) / args.steps
        ratios.append(t["torch"] / t["gpucloud"])
        if comm.rank == 0:
            print(f"round {r}: gloo {t['torch'] * 1e3:.2f} ms, gpucloud {t['gpucloud'] * 1e3:.2f} ms per step, "
                  f"ratio {ratios[-1]:.2f}", flush=True)
    if comm.rank == 0:
        report("DDP step with the hook", ratios)
    del sides
    dist.barrier()  # every rank is done with the group before it ends
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["optimizer", "hook"])
    ap.add_argument("--params", type=int, default=64)
    ap.add_argument("--kind", choices=["adamw", "sgd"], default="adamw", help="optimizer: which one")
    ap.add_argument("--mib", type=int, default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None,
                    help="optimizer: torch's intra-op threads and gpucloud's host threads (GPUCLOUD_HOST_THREADS)")
    args = ap.parse_args()
    if args.threads is not None:  # before gpucloud's host thread pool starts (at its first large launch)
        os.environ["GPUCLOUD_HOST_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    if args.mib is None:
        args.mib = 64 if args.what == "optimizer" else 16
    (bench_optimizer if args.what == "optimizer" else bench_hook)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
