#!/usr/bin/env python3
"""gpucloud's GEMM against torch.matmul on the same tensors, in one process: square products and a
transformer layer's linear layers, bf16 and fp32, as a ratio (torch time / gpucloud time: above 1
means gpucloud is faster).

    python bench/bench_gemm_torch.py [--threads N] [--rounds 7] [--precisions bf16,fp32] [--json out.json]

On the CPU torch runs oneDNN (bf16) and its BLAS (fp32); gpucloud runs oneDNN's bf16 matmul where the
CPU has bf16 dot products (gc.build_info().host_bf16_gemm says which) and OpenBLAS for fp32. Both
write into a preallocated C of the inputs' dtype (torch.matmul(out=...)); the two sides alternate
round by round, each round as many calls as make ~0.1 s, and the figure is the median of the
rounds' ratios. Set OMP_NUM_THREADS/OPENBLAS_NUM_THREADS to --threads to compare like with like.
"""
import argparse
import json
import os
import statistics
import sys
import time

import gpucloud as gc

try:
    import torch
except ImportError:  # pragma: no cover - reported, not an error
    torch = None

# name, m, n, k, trans_b: square products, and GPT-2 medium's linear layers on 2048 tokens
# (activations x weight^T, as nn.Linear stores the weight out x in).
SHAPES = [("square", 256, 256, 256, False), ("square", 512, 512, 512, False), ("square", 1024, 1024, 1024, False),
          ("square", 2048, 2048, 2048, False), ("qkv", 2048, 3072, 1024, True), ("mlp_fc", 2048, 4096, 1024, True),
          ("mlp_proj", 2048, 1024, 4096, True)]


def rounds_interleaved(rounds, calls, ours, theirs, sync):
    """Per-round seconds per call of each side, alternating round by round after a warm-up each."""
    for fn in (ours, theirs):
        fn()
        sync()
    times = ([], [])
    for _ in range(rounds):
        for i, fn in enumerate((ours, theirs)):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[i].append((time.perf_counter() - t0) / calls)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--json")
    args = ap.parse_args()
    if torch is None:
        print("bench_gemm_torch: PyTorch is not installed; nothing to compare against (Debian: python3-torch)")
        return 0
    torch.set_num_threads(args.threads)
    s = gc.Stream(gc.Device.host())
    info = gc.build_info()
    print(f"GEMM, host, torch {torch.__version__} ({torch.get_num_threads()} threads), gpucloud {info.host_blas} / "
          f"bf16: {info.host_bf16_gemm}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')} "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')}; ms per call (median of "
          f"{args.rounds} alternating rounds), torch / gpucloud")
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    runs = []
    for prec in filter(None, args.precisions.split(",")):
        ratios = []
        for name, m, n, k, trans_b in SHAPES:
            g = torch.Generator().manual_seed(0)
            a = torch.randn(m, k, generator=g).to(dtypes[prec])
            b = torch.randn(*((n, k) if trans_b else (k, n)), generator=g).to(dtypes[prec])
            c = torch.empty(m, n, dtype=dtypes[prec])
            calls = max(1, int(0.1 * 100e9 / (2.0 * m * n * k)))  # ~0.1 s at 100 GFLOP/s
            bt = b.t() if trans_b else b

            def ours():
                gc.gemm(c, a, b, s, trans_b=trans_b)

            def theirs():
                torch.matmul(a, bt, out=c)

            t_ours, t_theirs = rounds_interleaved(args.rounds, calls, ours, theirs, s.synchronize)
            ratio = statistics.median(x / y for x, y in zip(t_theirs, t_ours))
            mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
            ratios.append(ratio)
            flops = 2.0 * m * n * k
            shape = f"{m}x{n}x{k}" + (" (b^T)" if trans_b else "")
            print(f"  {prec} {name:8s} {shape:20s} gpucloud {1e3 * mo:8.3f}  "
                  f"torch {1e3 * mt:8.3f}  = {ratio:4.2f}   ({flops / mo / 1e9:5.0f} vs {flops / mt / 1e9:5.0f} GFLOP/s)")
            runs.append({"name": f"BM_GemmVsTorch/{name}/m:{m}/n:{n}/k:{k}/batch:1", "label": f"host {prec}",
                         "real_time": mo, "time_unit": "s", "run_type": "iteration", "iterations": calls * args.rounds,
                         "TFLOPs": flops / mo / 1e12, "torch_TFLOPs": flops / mt / 1e12, "ratio_vs_torch": ratio})
        print(f"  {prec}: geometric mean torch / gpucloud {statistics.geometric_mean(ratios):.2f}, "
              f"lowest {min(ratios):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": {"executable": sys.argv[0], "torch": torch.__version__,
                                   "threads": args.threads}, "benchmarks": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
