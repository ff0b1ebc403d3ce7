#!/usr/bin/env python3
"""gpucloud.checkpoint against torch.save / torch.load and safetensors on the same torch tensors:
saves, and loads from the page cache ("cached") and from the disk ("cold"), interleaved round by
round in rotating order, every result checked equal to the state saved.

    bench_checkpoint_torch.py [--mib 1024] [--tensors 16] [--rounds 5] [--dir DIR] [--json FILE]

Saves: torch.save of the state dict to a new file followed by an fsync of the file and the
directory (as durable as gpucloud's commit), the previous round's file then deleted, against
gpucloud.checkpoint.Checkpointer.save (safetensors file, XXH3-64 checksums, manifest, fsyncs,
rename; keep_last=1). Both write new files every round: this VM's disk rewrites a file with the
bytes it already holds ~6x faster than it writes new ones (dd conv=fsync, 1 GiB: 0.8 s against
4.7 s), which made torch.save into one path look 5x faster.
Loads, into the model's existing tensors (what a restart does):
  gpucloud     gpucloud.checkpoint.load(directory, model, stream): every tensor's checksum verified
               before any byte of the model changes, then copied in (two reads of the data)
  gpucloud one-pass  the same with verify="while_copying": each tensor hashed while it is copied
               (one read; a damaged tensor leaves the others written)
  safetensors  safetensors.torch.load_file of the very file gpucloud wrote (it maps the file), then
               copy_ into the model as Module.load_state_dict does; no checksums
  torch.load   torch.load of torch.save's file, then copy_ into the model; no checksums
"cold": the files' pages are dropped from the page cache (posix_fadvise DONTNEED) before each load.
Peers run at their fastest setting here: torch's intra-op threads = the CPUs this process may use.
Prints every round, then per comparison the median ratio peer_time / gpucloud_time (above 1:
gpucloud is faster) with its range, and the machine's load average before and after.
Needs torch and safetensors (the interop configuration).
"""
import argparse
import json
import os
import shutil
import statistics
import time

import torch
from safetensors.torch import load_file

import gpucloud as gc


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def evict(paths):
    """Drops the files' clean pages from the page cache: the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="bench_checkpoint_torch.tmp")
    ap.add_argument("--json", help="also write the medians here (bench/report.py reads them)")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    floats = args.mib * (1 << 20) // 4
    weights = [args.tensors + t for t in range(args.tensors)]
    g = torch.Generator().manual_seed(0)
    state = {f"layer{t}.weight": torch.rand(floats // sum(weights) * w, generator=g) for t, w in enumerate(weights)}
    model = {k: torch.zeros_like(v) for k, v in state.items()}
    nbytes = sum(t.numel() * 4 for t in state.values())
    s = gc.Stream()
    load_before = os.getloadavg()
    print(f"{nbytes / (1 << 20):.1f} MiB in {args.tensors} fp32 torch tensors (random), torch {torch.__version__} "
          f"on {threads} thread(s), gpucloud {gc.__version__}, load average {load_before[0]:.2f}")

    ck_root = os.path.join(args.dir, "gpucloud")
    torch_path = None

    def save(side, r):
        nonlocal torch_path
        if side == "torch.save":  # a new file each round, the last one deleted (as keep_last=1)
            path = os.path.join(args.dir, f"state-{r}.pt")
            torch.save(state, path)
            fsync_path(path)
            fsync_path(args.dir, directory=True)
            if torch_path:
                os.unlink(torch_path)
            torch_path = path
        else:
            gc.checkpoint.Checkpointer(ck_root, keep_last=1).save(r, state, s)

    def load(side):
        if side.startswith("gpucloud"):
            verify = "while_copying" if side == "gpucloud one-pass" else "before_writing"
            gc.checkpoint.load(gc.checkpoint.latest(ck_root), model, s, verify=verify)
            return
        sd = load_file(st_file) if side == "safetensors" else torch.load(torch_path)
        with torch.no_grad():
            for k, v in sd.items():
                model[k].copy_(v)

    def check(side):
        for k, v in state.items():
            if not torch.equal(model[k], v):
                raise SystemExit(f"{side}: tensor {k} differs from the state saved")
        for v in model.values():
            v.zero_()

    times = {}
    for r in range(args.rounds):
        for side in (["torch.save", "gpucloud"] if r % 2 == 0 else ["gpucloud", "torch.save"]):
            t = time.perf_counter()
            save(side, r)
            times.setdefault(("save", side), []).append(time.perf_counter() - t)
        directory = gc.checkpoint.latest(ck_root)
        st_file = os.path.join(directory, "rank-00000.safetensors")
        ours = [os.path.join(directory, "manifest.json"), st_file]
        files = {"gpucloud": ours, "gpucloud one-pass": ours, "safetensors": [st_file], "torch.load": [torch_path]}
        sides = list(files)
        for cache in ("cached", "cold"):
            for side in sides[r % len(sides):] + sides[:r % len(sides)]:
                if cache == "cached":  # a load first: the files in the page cache
                    load(side)
                    check(side)
                else:
                    evict(files[side])
                t = time.perf_counter()
                load(side)
                times.setdefault((cache, side), []).append(time.perf_counter() - t)
                check(side)
        print(f"round {r}: " + ", ".join(f"{what} {side} {ts[-1]:.3f} s" for (what, side), ts in times.items()))

    load_after = os.getloadavg()
    shutil.rmtree(args.dir, ignore_errors=True)
    results = []
    for what, peer, side in (("save", "torch.save", "gpucloud"), ("cached", "safetensors", "gpucloud"),
                             ("cached", "safetensors", "gpucloud one-pass"), ("cached", "torch.load", "gpucloud"),
                             ("cold", "safetensors", "gpucloud"), ("cold", "safetensors", "gpucloud one-pass"),
                             ("cold", "torch.load", "gpucloud")):
        ours = times[(what, side)]
        ratios = [p / o for p, o in zip(times[(what, peer)], ours)]
        med = statistics.median(ratios)
        gbps = nbytes / 1e9 / statistics.median(ours)
        peer_gbps = nbytes / 1e9 / statistics.median(times[(what, peer)])
        name = "save" if what == "save" else f"load ({what}{', one pass' if side != 'gpucloud' else ''})"
        print(f"{name:24s} vs {peer:11s}: median {peer}/gpucloud time {med:.2f} (range {min(ratios):.2f}-"
              f"{max(ratios):.2f}); gpucloud {gbps:.2f} GB/s, {peer} {peer_gbps:.2f} GB/s")
        results.append({"name": f"checkpoint/{name}/vs {peer}", "run_type": "iteration", "bytes": nbytes,
                        "gpucloud_GBps": gbps, "peer": peer, "peer_GBps": peer_gbps, "ratio_vs_peer": med,
                        "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": args.rounds})
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({threads} CPUs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": {"torch": torch.__version__, "threads": threads, "loadavg_before": load_before[0],
                                   "loadavg_after": load_after[0]}, "benchmarks": results}, f, indent=1)


if __name__ == "__main__":
    main()
