#!/usr/bin/env python3
"""What a checkpoint costs the training loop: train_mlp's wall time with no checkpoints, with an
asynchronous checkpoint every N steps (the library's save_async: the loop only pays the snapshot)
and with a synchronous one (save: the loop waits for the files), interleaved round by round.

    bench_checkpoint_train.py TRAIN_MLP [--steps 2000] [--every 50] [--rounds 3] [--dir DIR]

Prints each run and the median slowdown of each variant against no checkpoints (target for the
asynchronous one: within 5 %).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_mlp")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="bench_checkpoint_train.tmp")
    ap.add_argument("--blas-threads", type=int, help="OPENBLAS_NUM_THREADS for the runs (default: OpenBLAS's)")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.blas_threads:
        env["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    common = [args.train_mlp, "--steps", str(args.steps), "--log-every", str(args.steps), "--overflow-at", "-1",
              "--dtype", "fp16"]
    variants = {
        "none": [],
        "async": ["--checkpoint-dir", args.dir, "--checkpoint-every", str(args.every), "--keep-last", "2"],
        "sync": ["--checkpoint-dir", args.dir, "--checkpoint-every", str(args.every), "--keep-last", "2",
                 "--checkpoint-sync"],
    }
    times = {k: [] for k in variants}
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            shutil.rmtree(args.dir, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run(common + variants[name], check=True, capture_output=True, env=env)
            times[name].append(time.perf_counter() - t)
            print(f"round {r} {name:5s} {times[name][-1]:.3f} s")
    shutil.rmtree(args.dir, ignore_errors=True)
    base = statistics.median(times["none"])
    print(f"OPENBLAS_NUM_THREADS={env.get('OPENBLAS_NUM_THREADS', '(default)')}; train_mlp, {args.steps} steps, a checkpoint every {args.every} steps ({args.steps // args.every} saves):")
    for name in variants:
        m = statistics.median(times[name])
        print(f"  {name:5s} median {m:.3f} s  steps/s {args.steps / m:8.1f}  vs none {m / base - 1:+.1%}")


if __name__ == "__main__":
    main()
