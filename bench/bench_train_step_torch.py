#!/usr/bin/env python3
"""One training step of the same MLP, with gpucloud and with PyTorch, in one process, as a ratio.

The model is examples/train_mlp's (32 -> H -> H -> 1, ReLU, MSE loss, AdamW). Both trainers start
from the same weights and see the same batches; a step is forward, backward and the optimizer
update, and the stream is synchronised at its end (a real training loop would not wait, but the
comparison must). Rounds alternate between the two, so background load hits both alike; the
figure is the median of the rounds.

    python bench/bench_train_step_torch.py [--batch 256] [--hidden 128] [--dtype fp32]
        [--device host|cuda] [--steps 50] [--rounds 7] [--json out.json]

On the host (CPU) it compares against torch's CPU build in fp32. torch runs with one intra-op
thread by default (--threads): in one process its OpenMP pool and OpenBLAS's threads (gpucloud's
GEMMs) spin against each other, and on a 2-core machine both get slower with more. On a
GPU (--device cuda, torch with CUDA) both run on the GPU; fp16/bf16 there use gpucloud's loss
scaler and fp32 masters, and torch.autocast + GradScaler. It prints samples/s of each and
gpucloud / torch (above 1: gpucloud is faster), and with --json writes Google-Benchmark-shaped
JSON that bench/report.py reads. The two trainers' losses after the same steps are printed too,
as a check that both did the same work.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import gpucloud as gc

try:
    import torch
except ImportError:  # pragma: no cover - reported, not an error
    torch = None

IN = 32


def batches(count, batch, seed=11):
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((IN, 1)) / np.sqrt(IN)
    out = []
    for _ in range(count):
        x = rng.standard_normal((batch, IN)).astype(np.float32)
        y = np.tanh(x @ teacher).astype(np.float32)
        out.append((x, y))
    return out


def initial_weights(hidden, seed=3):
    rng = np.random.default_rng(seed)
    dims = [IN, hidden, hidden, 1]
    ws = [(rng.standard_normal((dims[i], dims[i + 1])) * np.sqrt(2 / dims[i])).astype(np.float32) for i in range(3)]
    bs = [np.zeros(dims[i + 1], np.float32) for i in range(3)]
    return ws, bs


class GpucloudTrainer:
    """Forward through gemm epilogues, backward through gemm + relu_backward + bias_grad, FusedAdam."""

    def __init__(self, ws, bs, batch, dtype, dev, lr):
        self.dev, self.dtype, self.s = dev, dtype, gc.Stream(dev)
        s = self.s

        def on_device(a, dt=dtype):
            f32 = gc.Buffer(a.shape, "float32", dev)
            gc.copy(f32, np.ascontiguousarray(a, np.float32), s)
            out = gc.Buffer(a.shape, dt, dev)
            gc.cast(out, f32, s)
            return out

        self.on_device = on_device
        self.w = [on_device(w) for w in ws]
        self.b = [on_device(b) for b in bs]
        self.dw = [gc.Buffer(w.shape, dtype, dev) for w in self.w]
        self.db = [gc.Buffer(b.shape, dtype, dev) for b in self.b]
        hidden = ws[0].shape[1]
        self.h1, self.h2, self.dh1, self.dh2 = (gc.Buffer((batch, hidden), dtype, dev) for _ in range(4))
        self.dout = gc.Buffer((batch, 1), dtype, dev)
        self.pred, self.loss = gc.Buffer((batch, 1), "float32", dev), gc.Buffer(1, "float32", dev)
        self.b3 = gc.Buffer(1, "float32", dev)
        self.x, self.y = gc.Buffer((batch, IN), dtype, dev), gc.Buffer((batch, 1), "float32", dev)
        self.x32 = gc.Buffer((batch, IN), "float32", dev)
        params = [(self.w[i], self.dw[i]) for i in range(3)] + [(self.b[i], self.db[i]) for i in range(3)]
        self.grads = [g for _, g in params]
        self.opt = gc.FusedAdam(params, s, lr=lr, decoupled_weight_decay=True, weight_decay=0.01)
        mixed = dtype != "float32"
        self.scaler = gc.LossScaler(dev, s, init_scale=65536.0 if mixed else 1.0, dynamic=mixed)
        s.synchronize()

    def step(self, x, y):
        s = self.s
        if self.dtype == "float32":
            gc.copy(self.x, x, s)
        else:
            gc.copy(self.x32, x, s)
            gc.cast(self.x, self.x32, s)
        gc.copy(self.y, y, s)
        w, b, dw, db = self.w, self.b, self.dw, self.db
        gc.gemm(self.h1, self.x, w[0], s, epilogue="bias_relu", bias=b[0])
        gc.gemm(self.h2, self.h1, w[1], s, epilogue="bias_relu", bias=b[1])
        gc.cast(self.b3, b[2], s)
        gc.gemm(self.pred, self.h2, w[2], s, epilogue="bias", bias=self.b3)
        gc.mse_loss(self.pred, self.y, self.loss, self.dout, s, self.scaler)
        gc.gemm(dw[2], self.h2, self.dout, s, trans_a=True)
        gc.bias_grad(self.dout, db[2], s)
        gc.gemm(self.dh2, self.dout, w[2], s, trans_b=True)
        gc.relu_backward(self.dh2, self.h2, s)
        gc.gemm(dw[1], self.h1, self.dh2, s, trans_a=True)
        gc.bias_grad(self.dh2, db[1], s)
        gc.gemm(self.dh1, self.dh2, w[1], s, trans_b=True)
        gc.relu_backward(self.dh1, self.h1, s)
        gc.gemm(dw[0], self.x, self.dh1, s, trans_a=True)
        gc.bias_grad(self.dh1, db[0], s)
        self.scaler.unscale(self.grads, s)
        self.opt.step(s, self.scaler)
        self.scaler.update(s)
        s.synchronize()

    def last_loss(self):
        out = np.empty(1, np.float32)
        gc.copy(out, self.loss, self.s)
        self.s.synchronize()
        return float(out[0])


class TorchTrainer:
    """The same model in torch: nn.Linear layers, MSELoss, torch.optim.AdamW (+ autocast/GradScaler)."""

    def __init__(self, ws, bs, dtype, device, lr):
        self.device = torch.device(device)
        layers = []
        for i, (w, b) in enumerate(zip(ws, bs)):
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            layers.append(lin)
            if i < 2:
                layers.append(torch.nn.ReLU())
        self.model = torch.nn.Sequential(*layers).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        self.amp = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
        self.scaler = torch.cuda.amp.GradScaler() if self.amp == torch.float16 else None
        self.loss = None

    def step(self, x, y):
        x = torch.from_numpy(x).to(self.device, non_blocking=True)
        y = torch.from_numpy(y).to(self.device, non_blocking=True)
        self.opt.zero_grad(set_to_none=True)
        if self.amp is not None:
            with torch.autocast(self.device.type, dtype=self.amp):
                loss = torch.nn.functional.mse_loss(self.model(x).float(), y)
        else:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.loss = loss

    def last_loss(self):
        return float(self.loss.detach().cpu())


def timed(trainer, data):
    t0 = time.perf_counter()
    for x, y in data:
        trainer.step(x, y)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument("--device", default="host", help="host, or cuda (both trainers on GPU 0)")
    ap.add_argument("--steps", type=int, default=50, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch's intra-op threads on the CPU (default 1: its fastest here; with more, its "
                         "OpenMP pool and OpenBLAS's threads spin against each other in one process)")
    ap.add_argument("--json", help="write Google-Benchmark-shaped JSON here")
    args = ap.parse_args()
    if torch is None:
        print("bench_train_step_torch: PyTorch is not installed; nothing to compare against (Debian: python3-torch)")
        return 0
    dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[args.dtype]
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("bench_train_step_torch: --device cuda needs torch with CUDA and a GPU")
        return 1
    if not on_gpu and dtype != "float32":
        print("bench_train_step_torch: on the CPU the comparison is fp32 (torch's CPU autocast is not PyTorch's "
              "training path); use --dtype fp32")
        return 1
    if not on_gpu:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    ws, bs = initial_weights(args.hidden)
    ours = GpucloudTrainer(ws, bs, args.batch, dtype, gc.Device("cuda:0" if on_gpu else "host"), args.lr)
    theirs = TorchTrainer(ws, bs, dtype, "cuda" if on_gpu else "cpu", args.lr)
    warmup = batches(5, args.batch, seed=1)
    timed(ours, warmup)
    timed(theirs, warmup)
    data = batches(args.steps, args.batch)
    t_ours, t_theirs = [], []
    for _ in range(args.rounds):
        t_ours.append(timed(ours, data))
        t_theirs.append(timed(theirs, data))
    samples = args.steps * args.batch
    sps_ours = samples / statistics.median(t_ours)
    sps_theirs = samples / statistics.median(t_theirs)
    ratio = sps_ours / sps_theirs
    where = f"{args.device}, {dtype}, batch {args.batch}, hidden {args.hidden}, torch {torch.__version__}"
    if not on_gpu:
        where += f", {threads} torch threads"
    print(f"training step ({where}); median of {args.rounds} rounds of {args.steps} steps")
    print(f"  gpucloud  {sps_ours:12.0f} samples/s   ({1e3 * statistics.median(t_ours) / args.steps:.3f} ms/step)")
    print(f"  torch     {sps_theirs:12.0f} samples/s   ({1e3 * statistics.median(t_theirs) / args.steps:.3f} ms/step)")
    print(f"  ratio gpucloud / torch: {ratio:.2f}")
    print(f"  loss after the same {5 + args.rounds * args.steps} steps: gpucloud {ours.last_loss():.5f}, "
          f"torch {theirs.last_loss():.5f}")
    if args.json:
        label = f"{args.device} {dtype}"
        runs = [
            {"name": f"BM_TrainStep/gpucloud/batch:{args.batch}/hidden:{args.hidden}", "label": label,
             "items_per_second": sps_ours, "ratio_to_torch": ratio, "real_time": statistics.median(t_ours) / args.steps,
             "time_unit": "s", "run_type": "iteration", "iterations": args.steps * args.rounds},
            {"name": f"BM_TrainStep/torch/batch:{args.batch}/hidden:{args.hidden}", "label": label,
             "items_per_second": sps_theirs, "real_time": statistics.median(t_theirs) / args.steps,
             "time_unit": "s", "run_type": "iteration", "iterations": args.steps * args.rounds},
        ]
        with open(args.json, "w") as f:
            json.dump({"context": {"executable": sys.argv[0], "torch": torch.__version__}, "benchmarks": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
