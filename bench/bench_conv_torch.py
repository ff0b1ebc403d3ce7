#!/usr/bin/env python3
"""gpucloud's convolution against PyTorch's on the same arrays, in one process: ResNet-50's layer
shapes, forward, backward-data and backward-filter, as a ratio (torch time / gpucloud time: above 1
means gpucloud is faster).

    python bench/bench_conv_torch.py [--batch 2] [--repeats 5] [--threads N] [--device host|cuda] [--json out.json]

On the CPU both run fp32 NCHW with every core (torch: oneDNN or its native kernels; gpucloud:
im2col + OpenBLAS). On a GPU (--device cuda, torch with CUDA) both call cuDNN, fp16 in NHWC
(channels_last). torch's backward passes are aten's own kernels (torch.ops.aten.convolution_backward
with one output each), not the Python helpers in torch.nn.grad. Each side is timed --repeats times,
the two alternating and the side that goes first alternating too, synchronised; the ratio is the
median of the per-round ratios, with its range; every pass's output is compared with torch's.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

import gpucloud as gc

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - reported, not an error
    torch = None

# name, c, hw, k, rs, stride, pad (bench/bench_conv.cpp's table)
LAYERS = [("conv1", 3, 224, 64, 7, 2, 3), ("res2_1x1_reduce", 256, 56, 64, 1, 1, 0), ("res2_3x3", 64, 56, 64, 3, 1, 1),
          ("res2_1x1_expand", 64, 56, 256, 1, 1, 0), ("res3_3x3_s2", 128, 56, 128, 3, 2, 1),
          ("res3_3x3", 128, 28, 128, 3, 1, 1), ("res4_3x3", 256, 14, 256, 3, 1, 1), ("res5_3x3", 512, 7, 512, 3, 1, 1),
          ("res5_1x1_expand", 512, 7, 2048, 1, 1, 0)]


def interleaved_ratios(repeats, ours, theirs, sync):
    """Per-round torch / gpucloud time ratios and each side's median time: the two alternate
    round by round, and which goes first alternates too (after one warm-up each), so a change in
    the machine's load reaches both."""
    for fn in (ours, theirs):
        fn()
        sync()
    ratios, times = [], ([], [])
    for r in range(repeats):
        t = [0.0, 0.0]
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            (ours, theirs)[i]()
            sync()
            t[i] = time.perf_counter() - t0
            times[i].append(t[i])
        ratios.append(t[1] / t[0])
    return ratios, float(np.median(times[0])), float(np.median(times[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="host")
    ap.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if torch is None:
        print("bench_conv_torch: PyTorch is not installed; nothing to compare against (Debian: python3-torch)")
        return 0
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("bench_conv_torch: --device cuda needs torch with CUDA and a GPU")
        return 1
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.float16 if on_gpu else torch.float32
    layout = "nhwc" if on_gpu else "nchw"
    s = gc.Stream(gc.Device("cuda:0" if on_gpu else "host"))
    sync = (lambda: (s.synchronize(), torch.cuda.synchronize())) if on_gpu else s.synchronize
    wanted = set(filter(None, args.layers.split(",")))
    runs = []
    print(f"convolution, {args.device}, {dtype}, {layout}, batch {args.batch}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; median ms of {args.repeats}, "
          f"gpucloud / torch = median ratio torch / gpucloud (range); outputs compared")
    for name, c, hw, k, rs, stride, pad in LAYERS:
        if wanted and name not in wanted:
            continue
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.batch, c, hw, hw, generator=g).to(dev, dtype)
        w = torch.randn(k, c, rs, rs, generator=g).to(dev, dtype)
        y = F.conv2d(x, w, stride=stride, padding=pad)
        dy = torch.randn(y.shape, generator=g).to(dev, dtype)
        if on_gpu:  # channels_last: the same memory order gpucloud's nhwc uses
            x, w, y, dy = (t.to(memory_format=torch.channels_last) for t in (x, w, y, dy))

        def ours_view(t):  # an NHWC tensor as gpucloud sees it: its memory, (n, h, w, c)
            return t.permute(0, 2, 3, 1) if on_gpu else t

        dx, dw = torch.empty_like(x), torch.empty_like(w)
        kw = dict(stride=stride, padding=pad, layout=layout)
        flops = 2.0 * y.numel() * c * rs * rs
        conv_args = ([stride, stride], [pad, pad], [1, 1], False, [0, 0], 1)

        def aten_backward(mask):  # aten's convolution backward, only the output asked for
            return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, mask)

        passes = {
            "forward": (lambda: gc.conv2d_forward(ours_view(y), ours_view(x), ours_view(w), s, **kw),
                        lambda: F.conv2d(x, w, stride=stride, padding=pad), y, lambda out: out),
            "backward_data": (lambda: gc.conv2d_backward_data(ours_view(dx), ours_view(dy), ours_view(w), s, **kw),
                              aten_backward([True, False, False]), dx, lambda out: out[0]),
            "backward_filter": (lambda: gc.conv2d_backward_filter(ours_view(dw), ours_view(x), ours_view(dy), s, **kw),
                                aten_backward([False, True, False]), dw, lambda out: out[1]),
        }
        cells = []
        for pname, (ours, theirs, ours_out, pick) in passes.items():
            ratios, t_ours, t_theirs = interleaved_ratios(args.repeats, ours, theirs, sync)
            ours()
            expected = pick(theirs())
            sync()
            tol = 2e-2 if on_gpu else 1e-3
            torch.testing.assert_close(ours_out.float(), expected.float(), rtol=tol, atol=tol * float(expected.abs().max()),
                                       msg=lambda m: f"{name} {pname}: {m}")
            ratio = float(np.median(ratios))
            cells.append(f"{pname} {1e3 * t_ours:7.2f} / {1e3 * t_theirs:7.2f} = {ratio:4.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
            runs.append({"name": f"BM_ConvVsTorch/{name}/{pname}/batch:{args.batch}", "label": f"{args.device} {dtype}",
                         "real_time": t_ours, "time_unit": "s", "run_type": "iteration", "iterations": args.repeats,
                         "TFLOPs": flops / t_ours / 1e12, "torch_TFLOPs": flops / t_theirs / 1e12,
                         "ratio_vs_torch": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios)})
        print(f"  {name:16s} " + "   ".join(cells))
    ratios = [r["ratio_vs_torch"] for r in runs]
    if ratios:
        print(f"  geometric mean torch / gpucloud: {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context": {"executable": sys.argv[0], "torch": torch.__version__}, "benchmarks": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
