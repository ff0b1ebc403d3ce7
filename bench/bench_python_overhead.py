#!/usr/bin/env python3
"""Per-call overhead of gpucloud's bindings against a bare pybind11 call in the same module.

    python bench/bench_python_overhead.py

Target (issue #7): a trivial binding within 2x of a bare pybind11 call of the same kind: a module
function against a bare pybind11 function, a method against a bare pybind11 method, a property
against a bare pybind11 property (Python's attribute lookup and bound-method creation are the
same for both and not gpucloud's to remove). Prints ns per call and the ratio for a few bindings,
from the trivial to one that borrows NumPy memory and enqueues work (gc.fill on a host stream,
synchronised once at the end).

Then host copies against `np.copyto` of the same arrays, interleaved call by call (each side's
median over rounds; gpucloud's time includes the stream synchronize): the issue #19 target is
>= 0.95 of `np.copyto` from 1 MiB up.
"""
import statistics
import time
import timeit

import numpy as np

import gpucloud as gc
import gpucloud._core as core


def per_call_ns(stmt, number, env):
    return min(timeit.repeat(stmt, number=number, repeat=5, globals=env)) / number * 1e9


def main():
    s = gc.Stream()
    b = gc.Buffer(16, "float32")
    a = np.zeros(16, np.float32)
    noop = core._Noop()
    env = {"core": core, "gc": gc, "s": s, "b": b, "a": a, "noop": noop}
    baselines = {kind: per_call_ns(stmt, 200000, env)
                 for kind, stmt in (("function", "core._noop()"), ("method", "noop.noop()"), ("property", "noop.value"))}
    for kind, t in baselines.items():
        print(f"bare pybind11 {kind:9s}        {t:8.1f} ns")
    for stmt, kind, n in (
        ("gc.cuda_device_count()", "function", 200000),
        ("b.size", "property", 200000),
        ("s.query()", "method", 200000),
        ("gc.fill(a, 1.0, s)", "function", 20000),
    ):
        t = per_call_ns(stmt, n, env)
        print(f"{stmt:30s} {t:8.1f} ns   ratio {t / baselines[kind]:5.2f} (vs a bare {kind})")
        s.synchronize()

    print()
    print("host copy vs np.copyto (same arrays, interleaved; median per call)")
    for size in (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20):
        src = np.full(size // 4, 1.0, np.float32)
        dst = np.zeros_like(src)
        rounds = max(20, min(2000, (256 << 20) // size))
        ours, theirs = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            gc.copy(dst, src, s)
            s.synchronize()
            t1 = time.perf_counter()
            np.copyto(dst, src)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"{size >> 10:8d} KiB   gc.copy {o * 1e6:9.1f} us   np.copyto {t * 1e6:9.1f} us   ratio {t / o:5.2f}")


if __name__ == "__main__":
    main()
