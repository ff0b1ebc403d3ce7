#!/usr/bin/env python3
"""gpucloud's fused AdamW step and unscale against the same math written as a NumPy loop, on the
same parameter set (a transformer's shapes), in one process, on the host backend.

    python bench/bench_amp_numpy.py [--layers 2] [--repeats 3] [--cast-rounds 9]

Prints one line per operation with both times (best of --repeats, the two sides alternating run
by run) and the ratio (NumPy time / gpucloud time: above 1 means gpucloud is faster). Then the
fp32 <-> fp16 casts against NumPy's (np.copyto into a preallocated array, its fastest form) at
1, 4 and 16 Mi elements: the two alternating call by call, the median ratio with its range over
--cast-rounds, every result compared bit for bit.
"""
import argparse
import time

import numpy as np

import gpucloud as gc


def transformer_parameter_sizes(layers, d=1024, vocab=50257, context=1024):
    sizes = [vocab * d, context * d]
    for _ in range(layers):
        sizes += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d]
    return sizes + [d, d]


def best_interleaved(repeats, ours, theirs):
    """Best time of each side, the two alternating run by run (after one warm-up each)."""
    times = [float("inf"), float("inf")]
    for fn in (ours, theirs):
        fn()
    for _ in range(repeats):
        for i, fn in enumerate((ours, theirs)):
            t0 = time.perf_counter()
            fn()
            times[i] = min(times[i], time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cast-rounds", type=int, default=9)
    args = ap.parse_args()
    sizes = transformer_parameter_sizes(args.layers)
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(n).astype(np.float16) * np.float16(0.02) for n in sizes]
    grads = [np.ones(n, np.float16) for n in sizes]
    s = gc.Stream()

    # NumPy AdamW with fp32 masters: the same arithmetic, one tensor at a time.
    masters = [w.astype(np.float32) for w in weights]
    ms = [np.zeros(n, np.float32) for n in sizes]
    vs = [np.zeros(n, np.float32) for n in sizes]
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
    step = [0]

    def numpy_adamw():
        step[0] += 1
        bc1, bc2 = 1 - b1 ** step[0], 1 - b2 ** step[0]
        for w, g, p, m, v in zip(weights, grads, masters, ms, vs):
            g32 = g.astype(np.float32)
            p *= 1 - lr * wd
            m += (1 - b1) * (g32 - m)
            v *= b2
            v += (1 - b2) * g32 * g32
            p -= (lr / bc1) * m / (np.sqrt(v) / np.sqrt(bc2) + eps)
            w[:] = p

    def numpy_unscale():
        inv = np.float32(1.0)
        found = False
        for g in grads:
            found |= not np.isfinite(g).all()
            g[:] = g.astype(np.float32) * inv

    opt = gc.FusedAdam(list(zip(weights, grads)), s, lr=lr, weight_decay=wd, decoupled_weight_decay=True)
    scaler = gc.LossScaler(gc.Device.host(), s, init_scale=1.0)

    def gpucloud_adamw():
        opt.step(s)
        s.synchronize()

    def gpucloud_unscale():
        scaler.unscale(grads, s)
        s.synchronize()

    params = sum(sizes)
    for name, ours, theirs, bytes_per in (
        ("unscale", gpucloud_unscale, numpy_unscale, 4),
        ("adamw step", gpucloud_adamw, numpy_adamw, 28),
    ):
        t_ours, t_np = best_interleaved(args.repeats, ours, theirs)
        print(
            f"{name:11s} {params / 1e6:.1f}M params: gpucloud {t_ours * 1e3:8.1f} ms "
            f"({params * bytes_per / t_ours / 1e9:5.2f} GB/s), numpy {t_np * 1e3:8.1f} ms, "
            f"ratio numpy/gpucloud {t_np / t_ours:.2f}"
        )
    casts(s, args.cast_rounds)


def casts(s, rounds):
    for n in (1 << 20, 4 << 20, 16 << 20):
        x32 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        x16 = x32.astype(np.float16)
        o16, p16 = np.empty(n, np.float16), np.empty(n, np.float16)
        o32, p32 = np.empty(n, np.float32), np.empty(n, np.float32)
        line = []
        for name, ours, theirs, out, peer in (
            ("fp32->fp16", lambda: gc.cast(o16, x32, s), lambda: np.copyto(p16, x32, casting="unsafe"), o16, p16),
            ("fp16->fp32", lambda: gc.cast(o32, x16, s), lambda: np.copyto(p32, x16), o32, p32),
        ):
            ratios = []
            for r in range(rounds + 1):
                t0 = time.perf_counter()
                ours()
                s.synchronize()
                t1 = time.perf_counter()
                theirs()
                t2 = time.perf_counter()
                if r:  # the first round warms both
                    ratios.append((t2 - t1) / (t1 - t0))
            if out.view(np.uint8).tobytes() != peer.view(np.uint8).tobytes():
                raise SystemExit(f"{name}: gpucloud's result differs from NumPy's")
            ratios.sort()
            line.append(f"{name} {ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")
        print(f"cast {n >> 20:2d} Mi elements, numpy/gpucloud median (range): " + ", ".join(line))


if __name__ == "__main__":
    main()
