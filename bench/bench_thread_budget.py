#!/usr/bin/env python3
"""The drop-in training step with torch and gpucloud in one process: default thread settings
against every hand-set split, interleaved.

    python bench/bench_thread_budget.py [--steps 20] [--rounds 7] [--hidden 1024] [--batch 256]

The step is a torch MLP's forward and backward (torch's OpenMP pool, and OpenBLAS's threads for
its matrix products) and gpucloud.torch.optim.AdamW's step (gpucloud's host thread pool). Each
configuration lives in its own process (thread counts are fixed at start): the defaults (nothing
set; and with torch's intra-op threads at the cores before gpucloud.torch is imported, as torch
starts on most machines), and every split of torch.set_num_threads, GPUCLOUD_HOST_THREADS and
OPENBLAS_NUM_THREADS in {1, cores} (set after the import). The processes are driven round by round, one at a time, so background load hits all
alike; each prints its losses' sum so the runs are checked to do the same work. The report gives
each configuration's median ms per step and defaults / best (1 or less: the defaults are as fast as
the best hand-set split).
"""
import argparse
import itertools
import os
import statistics
import subprocess
import sys
import time

WORKER = r"""
import os, sys, time
import torch
before, threads = int(sys.argv[1]), int(sys.argv[5])
if before:
    torch.set_num_threads(before)  # torch's default on most machines: the cores
import gpucloud.torch as gt
if threads:
    torch.set_num_threads(threads)
hidden, batch, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                            torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
opt = gt.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(batch, 256, generator=g), torch.randn(batch, 10, generator=g)
total = 0.0
def step():
    global total
    opt.zero_grad(set_to_none=True)
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    total += float(loss)
for _ in range(3):
    step()
print("ready", torch.get_num_threads(), flush=True)
for line in sys.stdin:
    if line.strip() != "go":
        break
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print((time.perf_counter() - start) / steps * 1e3, total, flush=True)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, cores})
    # torch's default intra-op threads are the cores on most machines (Debian's build: 1): both.
    configs = {"defaults": (0, 0, {}), "defaults, torch starting at the cores": (cores, 0, {})}
    for t, g, o in itertools.product(counts, counts, counts):
        configs[f"torch {t}, gpucloud {g}, openblas {o}"] = (0, t, {"GPUCLOUD_HOST_THREADS": str(g),
                                                                  "OPENBLAS_NUM_THREADS": str(o)})
    workers = {}
    for name, (before, t, env) in configs.items():
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("GPUCLOUD_HOST_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
        p = subprocess.Popen([sys.executable, "-c", WORKER, str(before), str(args.hidden), str(args.batch),
                              str(args.steps), str(t)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(clean, **env))
        ready = p.stdout.readline().split()
        assert ready and ready[0] == "ready", ready
        workers[name] = (p, int(ready[1]))
    times = {name: [] for name in configs}
    totals = {}
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            p = workers[name][0]
            time.sleep(0.3)  # the previous process's spinning threads go to sleep
            p.stdin.write("go\n")
            p.stdin.flush()
            ms, total = p.stdout.readline().split()
            times[name].append(float(ms))
            totals[name] = float(total)
    for p, _ in workers.values():
        p.stdin.close()
        p.wait()
    print(f"the drop-in training step (torch MLP 256-{args.hidden}-{args.hidden}-10, batch {args.batch}, "
          f"gpucloud.torch.optim.AdamW), {cores} cores, median of {args.rounds} rounds of {args.steps} steps:")
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, med in sorted(medians.items(), key=lambda kv: kv[1]):
        print(f"  {name:36s} {med:7.2f} ms  (torch threads {workers[name][1]})")
    assert len({round(v, 3) for v in totals.values()}) == 1, f"the runs did different work: {totals}"
    best = min(v for k, v in medians.items() if not k.startswith("defaults"))
    for name in ("defaults", "defaults, torch starting at the cores"):
        print(f"{name} / best hand-set split: {medians[name] / best:.2f}")


if __name__ == "__main__":
    main()
