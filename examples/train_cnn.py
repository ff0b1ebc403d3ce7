#!/usr/bin/env python3
"""Mixed-precision training of a small convolutional network from Python: the twin of
examples/train_cnn.cpp.

12 x 12 images hold one line (horizontal, vertical, diagonal or anti-diagonal, at a random offset)
in Gaussian noise; the class is its orientation, which 3 x 3 filters separate, so 100 % is
achievable and the run must reach --target on 1024 held-out images. NHWC throughout:

    x (n,12,12,1) -conv 3x3 pad 1, 8 filters, bias+ReLU-> (n,12,12,8)
      -conv 3x3 stride 2 pad 1, 16 filters, bias+ReLU-> (n,6,6,16) -GEMM 576x4 + bias-> scores
      -> MSE against the one-hot class

The Prefetcher streams NumPy batches, conv2d / conv2d_backward_* and gemm do the work, the loss
scaler (fp16) skips a forced overflow, FusedAdam keeps fp32 masters.

    python examples/train_cnn.py [--steps 400] [--batch 64] [--dtype fp16|bf16|fp32] [--device host|cuda]
"""
import argparse
import time

import numpy as np

import example_support as support
import gpucloud as gc

SIDE, CLASSES, C1, C2, SIDE2 = 12, 4, 8, 16, 6
FLAT = SIDE2 * SIDE2 * C2
HELD_OUT = 1024


def images(seed, n, noise):
    """n images (n, 12, 12, 1) float32 and their classes, a pure function of seed."""
    rng = np.random.default_rng([31, seed])
    cls = rng.integers(0, CLASSES, n)
    offset = rng.integers(0, SIDE, n)
    y, z = np.meshgrid(np.arange(SIDE), np.arange(SIDE), indexing="ij")
    on = np.stack([(c == 0) & (y == o) | (c == 1) & (z == o) | (c == 2) & (z == (y + o) % SIDE) |
                   (c == 3) & (z == (o - y) % SIDE) for c, o in zip(cls, offset)])
    x = on.astype(np.float32) + noise * rng.standard_normal((n, SIDE, SIDE)).astype(np.float32)
    return x[..., None], cls


def batches(start, steps, n, noise):
    for step in range(start, steps):
        x, cls = images(step, n, noise)
        yield x, np.eye(CLASSES, dtype=np.float32)[cls]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=support.positive_int, default=400)
    ap.add_argument("--batch", type=support.positive_int, default=64)
    ap.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16")
    ap.add_argument("--lr", type=support.finite_float(low=0.0), default=3e-3)
    ap.add_argument("--noise", type=support.finite_float(low=0.0, low_inclusive=True), default=0.35)
    ap.add_argument("--log-every", type=support.positive_int, default=100)
    ap.add_argument("--overflow-at", type=support.step_or_none, default=200)
    ap.add_argument("--device", default="host")
    ap.add_argument("--target", type=support.finite_float(low=0.0, high=1.0), default=0.95)
    ap.add_argument("--checkpoint-dir", help="write gpucloud checkpoints here (root/step-N), asynchronously")
    ap.add_argument("--checkpoint-every", type=support.positive_int, default=200)
    ap.add_argument("--keep-last", type=support.positive_int, default=3, help="committed checkpoints kept")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    ap.add_argument("--metrics-port", type=int, default=-1, help="serve Prometheus metrics (0: a free port; -1: none)")
    args = ap.parse_args()
    if args.resume and not args.checkpoint_dir:
        ap.error("--resume needs --checkpoint-dir DIR")
    dtype = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[args.dtype]
    dev = gc.Device(args.device)
    s = gc.Stream(dev)
    monitor = gc.MetricsMonitor(dev)  # the device's load, for the progress lines and the summary
    metrics = None  # Prometheus metrics (docs/telemetry.md); a port that cannot be served is reported
    if args.metrics_port >= 0:
        try:
            metrics = gc.telemetry.serve_metrics(port=args.metrics_port)
            metrics.watch(monitor)
            print(f"metrics at http://{gc.telemetry.job_labels()['node']}:{metrics.port}/metrics", flush=True)
        except gc.Error as e:
            print(f"metrics not served ({e}); training goes on", flush=True)
    n = args.batch
    print(f"train_cnn.py: {dev}, {dtype}, batch {n}, {args.steps} steps")

    def on_device(array):
        return support.to_device(array, dtype, dev, s)

    def to_numpy(view):
        return support.to_numpy(view, dev, s)

    rng = np.random.default_rng(5)
    w1 = on_device(rng.standard_normal((C1, 3, 3, 1)) * np.sqrt(2 / 9))  # KRSC
    w2 = on_device(rng.standard_normal((C2, 3, 3, C1)) * np.sqrt(2 / (9 * C1)))
    w3 = on_device(rng.standard_normal((FLAT, CLASSES)) * np.sqrt(2 / FLAT))
    b1, b2, b3 = (on_device(np.zeros(k)) for k in (C1, C2, CLASSES))
    params = [w3, b3, w2, b2, w1, b1]  # backward order
    grads = [gc.Buffer(p.shape, dtype, dev) for p in params]
    dw3, db3, dw2, db2, dw1, db1 = grads
    opt = gc.FusedAdam(list(zip(params, grads)), s, lr=args.lr, weight_decay=0.01, decoupled_weight_decay=True)
    scaler = gc.LossScaler(dev, s, init_scale=65536.0 if dtype == "float16" else 1.0, dynamic=dtype == "float16")

    # Checkpoints: the weights and the optimizer's and scaler's state, saved in the background.
    saved = dict(zip(["model.head.weight", "model.head.bias", "model.conv2.weight", "model.conv2.bias",
                      "model.conv1.weight", "model.conv1.bias"], params))
    saved.update({"optimizer." + k: v for k, v in opt.state_dict().items()})
    saved.update({"scaler." + k: v for k, v in scaler.state_dict().items()})
    checkpointer = gc.checkpoint.Checkpointer(args.checkpoint_dir, keep_last=args.keep_last) if args.checkpoint_dir else None
    start = 0
    latest = gc.checkpoint.latest(args.checkpoint_dir) if args.resume else None
    if latest:
        start = gc.checkpoint.load(latest, saved, s).step
        opt.load_state_dict({k[10:]: v for k, v in saved.items() if k.startswith("optimizer.")}, s)
        scaler.load_state_dict({k[7:]: v for k, v in saved.items() if k.startswith("scaler.")}, s)
        print(f"resumed from {latest} at step {start}")

    h1, dh1 = (gc.Buffer((n, SIDE, SIDE, C1), dtype, dev) for _ in range(2))
    h2, dh2 = (gc.Buffer((n, SIDE2, SIDE2, C2), dtype, dev) for _ in range(2))
    scores, loss, b3f = gc.Buffer((n, CLASSES), "float32", dev), gc.Buffer(1, "float32", dev), gc.Buffer(CLASSES, "float32", dev)
    dscores = gc.Buffer((n, CLASSES), dtype, dev)
    xbuf = gc.Buffer((n, SIDE, SIDE, 1), dtype, dev)
    conv1 = dict(padding=1, layout="nhwc")
    conv2 = dict(padding=1, stride=2, layout="nhwc")

    def forward(x):
        gc.conv2d_forward(h1, x, w1, s, epilogue="bias_relu", bias=b1, **conv1)
        gc.conv2d_forward(h2, h1, w2, s, epilogue="bias_relu", bias=b2, **conv2)
        gc.cast(b3f, b3, s)  # the fp32 output's bias is given in fp32
        gc.gemm(scores, h2.reshape((n, FLAT)), w3, s, epilogue="bias", bias=b3f)

    prefetcher = gc.Prefetcher(batches(start, args.steps, n, args.noise), dev, depth=3)
    first = last = None
    t0, since = time.perf_counter(), 0
    recorded_skips, step_began = 0, time.perf_counter()
    for step in range(start, args.steps):
        batch = prefetcher.next(s)
        data_wait = prefetcher.last_wait.stream_idle_seconds  # the stream's stall, not the host's wait
        scale, new_skips = 0.0, 0
        x, y = batch.arrays
        gc.cast(xbuf, x.reshape((n, SIDE, SIDE, 1)), s)  # fp32 batch -> the model dtype
        forward(xbuf)
        gc.mse_loss(scores, y, loss, dscores, s, scaler)
        gc.gemm(dw3, h2.reshape((n, FLAT)), dscores, s, trans_a=True)
        gc.bias_grad(dscores, db3, s)
        gc.gemm(dh2.reshape((n, FLAT)), dscores, w3, s, trans_b=True)
        gc.relu_backward(dh2, h2, s)
        gc.bias_grad(dh2.reshape((n * SIDE2 * SIDE2, C2)), db2, s)
        gc.conv2d_backward_filter(dw2, h1, dh2, s, **conv2)
        if step == args.overflow_at:
            gc.fill(dw2, float("inf"), s)  # a forced overflow: skipped and logged
        gc.conv2d_backward_data(dh1, dh2, w2, s, **conv2)
        gc.relu_backward(dh1, h1, s)
        gc.bias_grad(dh1.reshape((n * SIDE * SIDE, C1)), db1, s)
        gc.conv2d_backward_filter(dw1, xbuf, dh1, s, **conv1)
        scaler.unscale(grads, s)
        opt.step(s, scaler)
        scaler.update(s)
        del batch
        since += 1
        if checkpointer and (step + 1) % args.checkpoint_every == 0:
            checkpointer.save_async(step + 1, saved, s, metadata={"example": "train_cnn.py"})
            print(f"checkpoint: step {step + 1} (writing in the background)")
        if step == start or (step + 1) % args.log_every == 0 or step + 1 == args.steps or step == args.overflow_at:
            value = float(to_numpy(loss)[0])
            first = value if first is None else first
            last = value
            skipped = step + 1 - opt.step_count(s)
            rate = since * n / max(time.perf_counter() - t0, 1e-9)
            scale = scaler.state(s).scale
            print(f"step {step + 1:5d}  loss {value:.5f}  scale {scale:8.0f}  images/s {rate:8.0f}  "
                  f"skipped {skipped}  {support.brief(monitor.latest())}")
            t0, since = time.perf_counter(), 0
            new_skips, recorded_skips = skipped - recorded_skips, skipped
        if metrics:
            metrics.steps.record(time.perf_counter() - step_began, n, data_wait, 0.0, scale, new_skips)
        step_began = time.perf_counter()
    if checkpointer:
        checkpointer.wait()
    correct = seen = 0
    for b in range(0, HELD_OUT, n):
        x, cls = images(1_000_000 + b, n, args.noise)
        gc.cast(xbuf, x, s)
        forward(xbuf)
        predicted = to_numpy(scores).argmax(axis=1)
        take = min(n, HELD_OUT - seen)
        correct += int((predicted[:take] == cls[:take]).sum())
        seen += take
    accuracy = correct / seen
    trained = f"loss {last:.5f} (first {first:.5f})" if first is not None else f"nothing to train after step {start}"
    print(f"final: {trained}, held-out accuracy {accuracy:.4f} on {seen} images "
          f"(target {args.target:.2f}: {'reached' if accuracy >= args.target else 'NOT reached'}), "
          f"skipped steps {args.steps - opt.step_count(s)}")
    print(support.describe(monitor.summary(), (args.steps - start) * args.batch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
