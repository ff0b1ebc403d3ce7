#!/usr/bin/env python3
"""gpucloud.checkpoint against torch.save on the same tensors, interleaved round by round.

    bench_checkpoint_torch.py [--mib 1024] [--tensors 16] [--rounds 5] [--dir DIR]

torch.save writes one file; it is followed by an fsync (and of the directory) so both sides are
equally durable. gpucloud saves the torch tensors without a copy (DLPack), as a safetensors file
with checksums and a manifest, committed by rename. Prints each round and the median of
torch_time / gpucloud_time (above 1: gpucloud is faster). Needs torch (the interop configuration).
"""
import argparse
import os
import shutil
import statistics
import time

import torch

import gpucloud as gc


def fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="bench_checkpoint_torch.tmp")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    floats = args.mib * (1 << 20) // 4
    weights = [args.tensors + t for t in range(args.tensors)]
    state = {f"layer{t}.weight": torch.full((floats // sum(weights) * w,), 0.001 * t) for t, w in enumerate(weights)}
    nbytes = sum(t.numel() * 4 for t in state.values())
    s = gc.Stream()
    print(f"{nbytes / (1 << 20):.1f} MiB in {args.tensors} fp32 torch tensors, torch {torch.__version__}")
    ratios = []
    for r in range(args.rounds):
        times = {}
        for side in (["torch", "gpucloud"] if r % 2 == 0 else ["gpucloud", "torch"]):
            t = time.perf_counter()
            if side == "torch":
                path = os.path.join(args.dir, f"torch-{r}.pt")
                torch.save(state, path)
                fsync_path(path)
                fsync_path(args.dir, directory=True)
            else:
                gc.checkpoint.Checkpointer(os.path.join(args.dir, "gpucloud")).save(r, state, s)
            times[side] = time.perf_counter() - t
        shutil.rmtree(os.path.join(args.dir, "gpucloud"), ignore_errors=True)
        os.remove(os.path.join(args.dir, f"torch-{r}.pt"))
        ratios.append(times["torch"] / times["gpucloud"])
        print(f"round {r}: torch.save {times['torch']:.3f} s, gpucloud {times['gpucloud']:.3f} s, "
              f"ratio {ratios[-1]:.3f}")
    shutil.rmtree(args.dir, ignore_errors=True)
    print(f"median torch.save time / gpucloud save time: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
