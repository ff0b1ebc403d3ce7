#!/usr/bin/env python3
"""gpucloud.torch.Checkpointer.load of a torch module against the same restart with safetensors:
the module's state loaded from the page cache into the module, rounds alternating the order, every
result checked equal to the state saved.

    bench_torch_checkpointer.py [--mib 256] [--layers 4] [--rounds 6] [--dir DIR] [--json FILE]

  gpucloud     gt.Checkpointer(root).load({"model": module}): every tensor's checksum verified
               before any byte changes, the parameters loaded into themselves, load_state_dict run
  gpucloud one-pass  the same with verify="while_copying": each tensor hashed while it is copied
  safetensors  safetensors.torch.load_file of a file holding the module's state dict (it maps the
               file), then module.load_state_dict (strict), as a torch job restarts; no checksums
Each load is preceded by one untimed load of the same side (the files in the page cache), and the
module's parameters are zeroed between loads; the sides rotate their order round by round. Prints
every round, then per gpucloud side the median ratio safetensors_time / gpucloud_time (above 1:
gpucloud is faster) with its range, GB/s of each, and the machine's load average before and after. torch's intra-op threads = the CPUs this process may use.
Needs torch and safetensors (the interop configuration).
"""
import argparse
import json
import os
import shutil
import statistics
import time

import torch
from safetensors.torch import load_file, save_file

import gpucloud as gc
import gpucloud.torch as gt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", default="bench_torch_checkpointer.tmp")
    ap.add_argument("--json", help="also write the median here (bench/report.py reads it)")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    width = max(8, int((args.mib * (1 << 20) / 4 / args.layers) ** 0.5))
    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(args.layers)])
    saved = {k: v.clone() for k, v in module.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for v in saved.values())
    root, st_file = os.path.join(args.dir, "gpucloud"), os.path.join(args.dir, "model.safetensors")
    gt.Checkpointer(root).save(1, {"model": module})
    save_file(module.state_dict(), st_file)
    load_before = os.getloadavg()
    print(f"{nbytes / (1 << 20):.1f} MiB in {args.layers} x Linear({width}, {width}), torch {torch.__version__} "
          f"on {threads} thread(s), gpucloud {gc.__version__}, load average {load_before[0]:.2f}")

    def load(side):
        if side.startswith("gpucloud"):
            verify = "while_copying" if side == "gpucloud one-pass" else "before_writing"
            gt.Checkpointer(root).load({"model": module}, verify=verify)
        else:
            module.load_state_dict(load_file(st_file))

    def check(side):
        for k, v in module.state_dict().items():
            if not torch.equal(v, saved[k]):
                raise SystemExit(f"{side}: {k} differs from the state saved")
        with torch.no_grad():
            for v in module.parameters():
                v.zero_()

    times = {"gpucloud": [], "gpucloud one-pass": [], "safetensors": []}
    sides = list(times)
    for r in range(args.rounds):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            load(side)  # the files in the page cache
            check(side)
            t = time.perf_counter()
            load(side)
            times[side].append(time.perf_counter() - t)
            check(side)
        print(f"round {r}: " + ", ".join(f"{side} {ts[-1] * 1e3:.1f} ms" for side, ts in times.items()))
    load_after = os.getloadavg()
    shutil.rmtree(args.dir, ignore_errors=True)
    results = []
    peer_gbps = nbytes / 1e9 / statistics.median(times["safetensors"])
    for side, what in (("gpucloud", "load (cached)"), ("gpucloud one-pass", "load (cached, one pass)")):
        ratios = [p / o for p, o in zip(times["safetensors"], times[side])]
        med = statistics.median(ratios)
        gbps = nbytes / 1e9 / statistics.median(times[side])
        print(f"{what} vs safetensors + load_state_dict: median safetensors/gpucloud time {med:.2f} (range "
              f"{min(ratios):.2f}-{max(ratios):.2f}); gpucloud {gbps:.2f} GB/s, safetensors {peer_gbps:.2f} GB/s")
        results.append({"name": f"torch checkpointer/{what}/vs safetensors + load_state_dict", "run_type": "iteration",
                        "bytes": nbytes, "gpucloud_GBps": gbps, "peer": "safetensors", "peer_GBps": peer_gbps,
                        "ratio_vs_peer": med, "ratio_min": min(ratios), "ratio_max": max(ratios),
                        "rounds": args.rounds})
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({threads} CPUs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": {"torch": torch.__version__, "threads": threads, "loadavg_before": load_before[0],
                                   "loadavg_after": load_after[0]}, "benchmarks": results}, f, indent=1)


if __name__ == "__main__":
    main()
