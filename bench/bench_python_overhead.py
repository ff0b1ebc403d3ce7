#!/usr/bin/env python3
"""Per-call overhead of gpucloud's bindings against a bare pybind11 call in the same module.

    python bench/bench_python_overhead.py

Target (issue #7): a trivial binding within 2x of a bare pybind11 call. Prints ns per call and the
ratio for a few bindings, from the trivial (a property) to one that borrows NumPy memory and
enqueues work (gc.fill on a host stream, synchronised once at the end).
"""
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
    env = {"core": core, "gc": gc, "s": s, "b": b, "a": a}
    base = per_call_ns("core._noop()", 200000, env)
    print(f"bare pybind11 call:            {base:8.1f} ns")
    for stmt, n in (
        ("gc.cuda_device_count()", 200000),
        ("b.size", 200000),
        ("s.query()", 200000),
        ("gc.fill(a, 1.0, s)", 20000),
    ):
        name = stmt
        t = per_call_ns(stmt, n, env)
        print(f"{name:30s} {t:8.1f} ns   ratio {t / base:5.2f}")
        s.synchronize()


if __name__ == "__main__":
    main()
