#!/usr/bin/env python3
"""Data-parallel mixed-precision MLP training from Python: the twin of examples/train_mlp.cpp.

The prefetcher streams NumPy batches to the device, the GEMM runs forward (bias+ReLU epilogues)
and backward, mse_loss scales the output gradient by the loss scale, the dynamic scaler skips
overflowing steps (a forced one included) and logs them, FusedAdam keeps fp32 master weights,
GradBucketer averages gradients across MPI ranks, and a checkpoint every N steps can be resumed.

    python examples/train_mlp.py [--steps 1500] [--dtype fp16|bf16|fp32] [--device host|cuda]
    mpirun -np 2 python examples/train_mlp.py
    srun --mpi=pmix -n 2 python examples/train_mlp.py           (deploy/slurm/*.sbatch)
    torchrun --nproc-per-node 2 examples/train_mlp.py           (deploy/k8s/train-mlp.yaml)

On SIGTERM or SIGUSR1 (a preemption notice) every rank finishes its step, they agree on where to
stop (gpucloud.elastic.JobControl), a checkpoint of that step is committed and the run exits with
status 75 (gpucloud.elastic.PREEMPTED_EXIT_CODE): the resumed run loses no step.

Ranks from MPI (mpirun, srun); under torchrun, NCCL through torchrun's store on GPUs and
torch.distributed's gloo on the host.
"""
import argparse
import os
import signal
import time

import numpy as np

import example_support as support
import gpucloud as gc

IN, HIDDEN, TEACHER = 32, 128, 16


def teacher_weights():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((IN, TEACHER)) / np.sqrt(IN), rng.standard_normal((TEACHER, TEACHER)) / np.sqrt(TEACHER),
            rng.standard_normal(TEACHER))


def batches(start, steps, rank, local, dtype, teacher):
    """Each step's global batch is a function of the step alone; this rank takes its rows."""
    w1, w2, w3 = teacher
    for step in range(start, steps):
        rng = np.random.default_rng([11, step])
        x = rng.standard_normal((local * (rank + 1), IN))[local * rank:]
        y = (np.tanh(np.tanh(x @ w1) @ w2) @ w3).astype(np.float32).reshape(local, 1)
        yield x.astype(dtype), y


def sub_state(state, prefix):
    """The entries of `state` under `prefix`, the prefix removed (what load_state_dict takes)."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def communicator(launch, dev):
    """The job's ranks: MPI's (mpirun, srun), or torchrun's (its store for NCCL; gloo on the host)."""
    if launch.launcher != "torchrun":
        return gc.Communicator.nccl_from_mpi(dev) if dev.is_cuda else gc.Communicator.mpi_world()
    if dev.is_cuda:
        return gc.distributed.nccl_from_torchrun(dev)
    import torch.distributed as dist  # host collectives through gloo (gpucloud's checks on top)

    import gpucloud.torch as gt

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return gt.process_group_communicator()


def preempted(args, control, step, checkpointer, saved, s, say):
    """Stops for a preemption after ``step`` steps (every rank at the same step): that step's
    checkpoint, committed before the exit, then the status that asks for a requeue."""
    why = f"signal {signal.Signals(control.stop_signal).name}" if control.stop_signal else "a notice to another rank"
    code = gc.elastic.PREEMPTED_EXIT_CODE
    if checkpointer is None:
        say(f"preempted by {why} at step {step}: no --checkpoint-dir, the run's steps are lost")
        return code
    checkpointer.wait()  # the periodic save, if one is in flight (it may be this very step's)
    if step % args.checkpoint_every:
        checkpointer.save(step, saved, s, metadata={"example": "train_mlp.py", "dtype": args.dtype,
                                                    "reason": "preemption"})
    say(f"preempted by {why} at step {step}: checkpoint at step {step} committed, exit {code} to be requeued")
    return code


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=support.positive_int, default=1500)
    ap.add_argument("--batch", type=support.positive_int, default=256, help="global batch, divided over the ranks")
    ap.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default="fp16")
    ap.add_argument("--lr", type=support.finite_float(low=0.0), default=3e-3)
    ap.add_argument("--log-every", type=support.positive_int, default=250)
    ap.add_argument("--overflow-at", type=support.step_or_none, default=700)
    ap.add_argument("--device", default="host")
    ap.add_argument("--checkpoint-dir", help="write gpucloud checkpoints here (root/step-N), asynchronously")
    ap.add_argument("--checkpoint-every", type=support.positive_int, default=500)
    ap.add_argument("--keep-last", type=support.count, default=3, help="committed checkpoints kept (0: every one)")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    ap.add_argument("--metrics-port", type=int, default=-1,
                    help="serve Prometheus metrics (0: a free port; P > 0: P + the local rank; -1: none)")
    ap.add_argument("--dump", help="write the final fp32 weights (masters where the model is fp16/bf16) to this .npz")
    args = ap.parse_args()
    if args.resume and not args.checkpoint_dir:
        ap.error("--resume needs --checkpoint-dir DIR")
    # First: a preemption notice from here on stops the run at a step, with its state saved.
    control = gc.elastic.JobControl()

    np_dtype = {"fp16": np.float16, "bf16": np.float32, "fp32": np.float32}[args.dtype]  # bf16: cast on device
    model_dtype = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[args.dtype]
    launch = gc.launch_info_from_environment()
    dev = gc.Device(args.device)
    if launch.size > 1 and args.device == "cuda":  # one GPU per rank, gradients over NCCL
        dev = gc.Device.cuda(launch.local_rank % gc.cuda_device_count())
    comm = None
    if launch.size > 1:
        comm = communicator(launch, dev)
    rank, size = (comm.rank, comm.size) if comm else (0, 1)
    if args.batch % size != 0:
        ap.error(f"--batch: {args.batch} does not divide over {size} ranks (the global batch would be "
                 f"{args.batch // size * size}); pass a multiple of {size}")
    local = args.batch // size
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"train_mlp.py: {size} rank(s) on {dev}, {model_dtype}, global batch {args.batch}, {args.steps} steps")
    if control.restart.count:
        say(f"restart {control.restart.count} ({control.restart.reason})")

    s = gc.Stream(dev)
    # Rank 0 watches its device's load (nvidia-smi's figures) for the progress lines and the summary.
    monitor = gc.MetricsMonitor(dev) if rank == 0 or args.metrics_port >= 0 else None
    # Prometheus metrics of this rank (docs/telemetry.md); a port that cannot be served is reported
    # and the training goes on without it.
    metrics = None
    if args.metrics_port >= 0:
        try:
            port = args.metrics_port + launch.local_rank if args.metrics_port > 0 else 0
            metrics = gc.telemetry.serve_metrics(port=port)
            metrics.watch(monitor)
            print(f"rank {launch.rank}: metrics at http://{gc.telemetry.job_labels()['node']}:{metrics.port}/metrics",
                  flush=True)
        except gc.Error as e:
            print(f"rank {launch.rank}: metrics not served ({e}); training goes on", flush=True)

    def on_device(array):
        return support.to_device(array, model_dtype, dev, s)

    def to_numpy(view):
        return support.to_numpy(view, dev, s)

    rng = np.random.default_rng(3)
    dims = [IN, HIDDEN, HIDDEN, 1]
    weights = [on_device(rng.standard_normal((dims[i], dims[i + 1])) * np.sqrt(2 / dims[i])) for i in range(3)]
    biases = [on_device(np.zeros(dims[i + 1])) for i in range(3)]
    dweights = [gc.Buffer(w.shape, model_dtype, dev) for w in weights]
    dbiases = [gc.Buffer(b.shape, model_dtype, dev) for b in biases]
    # backward order: W3, b3, W2, b2, W1, b1
    params = [(weights[i], dweights[i]) for i in (2,)] + [(biases[2], dbiases[2])]
    params += [(weights[1], dweights[1]), (biases[1], dbiases[1]), (weights[0], dweights[0]), (biases[0], dbiases[0])]
    grads = [g for _, g in params]
    opt = gc.FusedAdam(params, s, lr=args.lr, decoupled_weight_decay=True)
    scaler = gc.LossScaler(dev, s, init_scale=65536.0 if args.dtype == "fp16" else 1.0, dynamic=args.dtype == "fp16")
    buckets = gc.GradBucketer(comm, grads, hierarchical=comm.nodes > 1 and comm.local_size > 1) if comm else None

    # What a checkpoint holds: the weights, the optimizer's and the scaler's state, all views of the
    # live state (saving and loading copy in stream order). The batches are a function of the step.
    saved = {}
    for i in range(3):
        saved[f"model.layer{i}.weight"], saved[f"model.layer{i}.bias"] = weights[i], biases[i]
    saved.update({"optimizer." + k: v for k, v in opt.state_dict().items()})
    saved.update({"scaler." + k: v for k, v in scaler.state_dict().items()})
    checkpointer = gc.checkpoint.Checkpointer(args.checkpoint_dir, keep_last=args.keep_last,
                                              comm=comm) if args.checkpoint_dir else None
    start = 0
    latest = gc.checkpoint.latest(args.checkpoint_dir) if args.resume else None
    if latest:
        began = time.perf_counter()
        manifest = gc.checkpoint.load(latest, saved, s)
        opt.load_state_dict(sub_state(saved, "optimizer."), s)
        scaler.load_state_dict(sub_state(saved, "scaler."), s)
        s.synchronize()
        start = manifest.step
        say(f"resumed from {latest} at step {start} (written by {manifest.world_size} rank(s)) in "
            f"{time.perf_counter() - began:.3f} s")
    elif args.resume:
        say(f"no checkpoint in {args.checkpoint_dir} yet: starting from step 0")

    prefetcher = gc.Prefetcher(batches(start, args.steps, rank, local, np_dtype, teacher_weights()), dev, depth=3)
    h1, h2, dh1, dh2 = (gc.Buffer((local, HIDDEN), model_dtype, dev) for _ in range(4))
    dout = gc.Buffer((local, 1), model_dtype, dev)
    pred = gc.Buffer((local, 1), "float32", dev)
    loss, loss_avg = gc.Buffer(1, "float32", dev), gc.Buffer(1, "float32", dev)
    b3 = gc.Buffer(1, "float32", dev)
    xbuf = gc.Buffer((local, IN), model_dtype, dev)
    first, last, t0, since, skipped = None, None, time.perf_counter(), 0, 0
    if metrics and comm:
        metrics.detect_stragglers(comm, s, every=50, threshold=0.2)
    comm_before = comm.busy_seconds if comm else 0.0
    pending = None
    step_began, recorded_skips, straggler_logged, scale = time.perf_counter(), 0, -1, 0.0
    for step in range(start, args.steps):
        batch = prefetcher.next(s)
        data_wait = prefetcher.last_wait.stream_idle_seconds  # the stream's stall, not the host's wait
        x_raw, y = batch.arrays
        x = x_raw.reshape(local, IN)
        if args.dtype == "bf16":  # NumPy has no bfloat16: the batch arrives in fp32
            gc.cast(xbuf, x, s)
            x = xbuf
        y = y.reshape(local, 1)
        gc.gemm(h1, x, weights[0], s, epilogue="bias_relu", bias=biases[0])
        gc.gemm(h2, h1, weights[1], s, epilogue="bias_relu", bias=biases[1])
        gc.cast(b3, biases[2], s)
        gc.gemm(pred, h2, weights[2], s, epilogue="bias", bias=b3)
        gc.mse_loss(pred, y, loss, dout, s, scaler)
        gc.gemm(dweights[2], h2, dout, s, trans_a=True)
        gc.bias_grad(dout, dbiases[2], s)
        gc.gemm(dh2, dout, weights[2], s, trans_b=True)
        gc.relu_backward(dh2, h2, s)
        gc.gemm(dweights[1], h1, dh2, s, trans_a=True)
        if step == args.overflow_at:
            gc.fill(dweights[1], float("inf"), s)  # a forced overflow: skipped and logged
        gc.bias_grad(dh2, dbiases[1], s)
        gc.gemm(dh1, dh2, weights[1], s, trans_b=True)
        gc.relu_backward(dh1, h1, s)
        gc.gemm(dweights[0], x, dh1, s, trans_a=True)
        gc.bias_grad(dh1, dbiases[0], s)
        if buckets:
            for i in range(len(grads)):
                buckets.mark_ready(i, s)
            buckets.wait(s)
        scaler.unscale(grads, s)
        opt.step(s, scaler)
        scaler.update(s)
        del batch
        since += 1
        if step == start or (step + 1) % args.log_every == 0 or step + 1 == args.steps or step == args.overflow_at:
            if comm:
                comm.all_reduce(loss, loss_avg, s, op="average")
            else:
                gc.copy(loss_avg, loss, s)
            state = scaler.state(s)
            value = float(to_numpy(loss_avg)[0])
            skipped = step + 1 - opt.step_count(s)
            first = value if first is None else first
            last = value
            rate = since * args.batch / max(time.perf_counter() - t0, 1e-9)
            say(f"step {step + 1:5d}  loss {value:.5f}  scale {state.scale:8.0f}  samples/s {rate:8.0f}  skipped {skipped}  "
                f"{support.brief(monitor.latest()) if monitor else ''}")
            t0, since = time.perf_counter(), 0
            scale = state.scale
        if metrics:
            now = time.perf_counter()
            comm_now = comm.busy_seconds if comm else 0.0
            logged = scale if step == start or (step + 1) % args.log_every == 0 else 0.0
            metrics.steps.record(now - step_began, local, data_wait, comm_now - comm_before, logged,
                                 skipped - recorded_skips if logged else 0)
            if logged:
                recorded_skips = skipped
            comm_before = comm_now
            report = metrics.straggler_report()
            if report.straggler and report.slowest != straggler_logged:
                say(f"  straggler: rank {report.slowest} works {1e3 * report.compute_seconds[report.slowest]:.1f} ms "
                    f"per step, the median {1e3 * report.median:.1f} ms")
                straggler_logged = report.slowest
        step_began = time.perf_counter()
        if checkpointer and (step + 1) % args.checkpoint_every == 0:
            # Snapshotted after this step's work, written while the next steps run. The previous
            # save has committed by now: its time from start to commit goes to the metrics.
            if metrics and pending is not None and pending.done() and pending.seconds > 0:
                metrics.steps.record_checkpoint(pending.seconds)
            pending = checkpointer.save_async(step + 1, saved, s, metadata={"example": "train_mlp.py",
                                                                           "dtype": args.dtype})
            say(f"checkpoint: step {step + 1} -> {pending.directory} (writing in the background)")
        if control.should_stop(step + 1, comm, s if comm else None):
            return preempted(args, control, step + 1, checkpointer, saved, s, say)
    if checkpointer:
        checkpointer.wait()
    s.synchronize()
    if args.dump and rank == 0:
        np.savez(args.dump, **{f"w{i}": to_numpy(opt.master(i) if opt.master(i).size else p.reshape(p.size))
                               for i, (p, _) in enumerate(params)})
    if first is None:
        say(f"final: nothing to do, the checkpoint is already at step {start}")
        return 0
    ratio = last / first
    say(f"final: loss {last:.5f} (first logged {first:.5f}, ratio {ratio:.4f}, target < 0.05: "
        f"{'reached' if ratio < 0.05 else 'NOT reached'}), skipped steps {skipped}")
    if monitor:
        say(support.describe(monitor.summary(), (args.steps - start) * local))  # this rank's samples
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
