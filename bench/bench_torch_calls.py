#!/usr/bin/env python3
"""Per-call cost of gpucloud calls on torch tensors, side by side with the same call on
gpucloud.Buffers and with torch's own: a 64x64x64 fp32 GEMM (gc.gemm into C, torch.matmul(out=C))
and a fill (gc.fill, Tensor.fill_), on one thread, each call synchronised (the host stream's work
done) so that the figures are whole calls.

    python bench/bench_torch_calls.py [--rounds 7] [--calls 20000]

The sides alternate round by round; the figure per side is its median over the rounds, and the
report gives gpucloud-on-torch minus gpucloud-on-Buffer (what taking torch tensors costs) and
torch / gpucloud-on-torch. Needs torch (the interop configuration).
"""
import argparse
import statistics
import time

import gpucloud as gc

try:
    import torch
except ImportError:  # pragma: no cover - reported, not an error
    torch = None


def per_call_us(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    if torch is None:
        print("torch is not installed: nothing to compare")
        return
    torch.set_num_threads(1)
    s = gc.Stream(gc.Device("host"))
    n = 64
    ta, tb, tc = (torch.randn(n, n) for _ in range(3))
    ba, bb, bc = (gc.Buffer((n, n), gc.DType.float32) for _ in range(3))
    for x, y in ((ba, ta), (bb, tb)):
        gc.copy(x, y, s)
    s.synchronize()

    def gemm_torch_tensors():
        gc.gemm(tc, ta, tb, s)
        s.synchronize()

    def gemm_buffers():
        gc.gemm(bc, ba, bb, s)
        s.synchronize()

    def fill_torch_tensor():
        gc.fill(tc, 1.0, s)
        s.synchronize()

    def fill_buffer():
        gc.fill(bc, 1.0, s)
        s.synchronize()

    cases = {
        "gemm 64^3": {"gpucloud on torch tensors": gemm_torch_tensors, "gpucloud on Buffers": gemm_buffers,
                      "torch.matmul(out=)": lambda: torch.matmul(ta, tb, out=tc)},
        "fill 64x64": {"gpucloud on torch tensors": fill_torch_tensor, "gpucloud on Buffers": fill_buffer,
                       "torch fill_": lambda: tc.fill_(1.0)},
    }
    # The results agree before anything is timed.
    gemm_torch_tensors()
    gemm_buffers()
    assert torch.allclose(tc, ta @ tb, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.from_dlpack(bc), tc)
    for case, sides in cases.items():
        times = {name: [] for name in sides}
        for fn in sides.values():
            per_call_us(fn, args.calls // 10)  # warm-up
        for _ in range(args.rounds):
            for name, fn in sides.items():
                times[name].append(per_call_us(fn, args.calls))
        med = {name: statistics.median(t) for name, t in times.items()}
        ours, buffers = med["gpucloud on torch tensors"], med["gpucloud on Buffers"]
        theirs = [v for k, v in med.items() if k.startswith("torch")][0]
        print(f"{case}: " + ", ".join(f"{k} {v:.2f} us" for k, v in med.items()) +
              f"; torch tensors cost {ours - buffers:+.2f} us over Buffers; torch / gpucloud-on-torch "
              f"{theirs / ours:.2f}")


if __name__ == "__main__":
    main()
