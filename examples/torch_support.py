"""What the two torch examples share: the job (gloo process group next to a gpucloud communicator),
the model and each rank's data, and checkpoints of a torch model + optimizer + GradScaler through
gpucloud.torch.Checkpointer (sharded across ranks, atomic, asynchronous)."""
import contextlib
import signal
import time

import torch
import torch.distributed as dist

import gpucloud as gc
import gpucloud.torch

STEPS_DEFAULT = 300


def start_job():
    """A gpucloud communicator over MPI, and the gloo process group torch.distributed needs (DDP, and
    all_gather for the report), its rendezvous over that communicator."""
    comm = gc.Communicator.mpi_world()
    gpucloud.torch.init_process_group(comm, "gloo")
    return comm


def make_model():
    torch.manual_seed(0)  # every rank starts from the same weights
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 1))


def batch(rank, step, size=64):
    """This rank's batch of step ``step``: y = sum(sin(x)) + noise, the same on every run."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(size, 32, generator=g)
    return x, torch.sin(x).sum(dim=1, keepdim=True) + 0.01 * torch.randn(size, 1, generator=g)


def state_of(model, opt, scaler):
    """What a checkpoint holds: gpucloud.torch.Checkpointer saves each through its state_dict()
    (a DDP model under the inner module's names, so both examples' checkpoints fit both)."""
    return {"model": model, "optimizer": opt, "scaler": scaler}


def report(comm, model, step, loss, scaler):
    """Rank 0 prints (``loss``: this rank's mean over the steps since the last report); every rank
    checks it holds the same weights as the others."""
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(w) for _ in range(comm.size)]
    with gpucloud.torch.settled(everyone, w):  # gloo lets go of them first (torch 2 aborts at exit otherwise)
        dist.all_gather(everyone, w)
    same = all(torch.equal(everyone[0], o) for o in everyone)
    if comm.rank == 0:
        print(f"step {step:5d}  loss {loss:.5f}  scale {scaler.get_scale():g}  ranks agree: {'yes' if same else 'NO'}",
              flush=True)
    if not same:
        raise SystemExit("the ranks' weights differ")
    return w


def arguments(doc):
    import argparse

    import example_support as support
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=support.positive_int, default=STEPS_DEFAULT)
    ap.add_argument("--lr", type=support.finite_float(low=0.0), default=3e-3)
    ap.add_argument("--log-every", type=support.positive_int, default=100)
    ap.add_argument("--overflow-at", type=support.step_or_none, default=150,
                    help="make rank 0's loss inf at this step: every rank must skip it (-1: never)")
    ap.add_argument("--checkpoint-dir", help="gpucloud checkpoints of model, optimizer and scaler (root/step-N)")
    ap.add_argument("--checkpoint-every", type=support.positive_int, default=100)
    ap.add_argument("--keep-last", type=support.positive_int, default=2)
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    ap.add_argument("--dump", help="write the final weights (a flat float32 tensor) here with torch.save")
    ap.add_argument("--metrics-port", type=int, default=-1,
                    help="serve Prometheus metrics (0: a free port; P > 0: P + the local rank; -1: none)")
    ap.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --slow-ms in every step's work "
                    "(a straggler, found with --metrics-port)")
    ap.add_argument("--slow-ms", type=support.finite_float(low=0.0), default=20.0)
    args = ap.parse_args()
    if args.resume and not args.checkpoint_dir:
        ap.error("--resume: needs --checkpoint-dir DIR")
    return args


def stop_for_preemption(args, ck, step, model, opt, scaler, control, comm):
    """Every rank stops after ``step`` steps (SIGTERM/SIGUSR1 on any rank, agreed by
    JobControl): that step's checkpoint is committed, then the status that asks for a requeue."""
    code = gc.elastic.PREEMPTED_EXIT_CODE
    if ck is not None:
        ck.wait()  # the periodic save, if one is in flight (it may be this very step's)
        if step % args.checkpoint_every:
            ck.save(step, state_of(model, opt, scaler))
    if comm.rank == 0:
        kept = f"checkpoint at step {step} committed" if ck is not None else "no --checkpoint-dir, the steps are lost"
        why = f"signal {signal.Signals(control.stop_signal).name}" if control.stop_signal else "a notice to another rank"
        print(f"preempted by {why} at step {step}: {kept}, exit {code} to be requeued", flush=True)
    leave()
    raise SystemExit(code)


def serve_metrics(args, comm):
    """This rank's /metrics endpoint (docs/telemetry.md), or None without --metrics-port (or when
    the port cannot be served: reported, and the training goes on)."""
    if args.metrics_port < 0:
        return None
    launch = gc.launch_info_from_environment()
    try:
        metrics = gc.telemetry.serve_metrics(port=args.metrics_port + launch.local_rank if args.metrics_port else 0)
    except gc.Error as e:
        print(f"rank {comm.rank}: metrics not served ({e}); training goes on", flush=True)
        return None
    print(f"rank {comm.rank}: metrics at http://{gc.telemetry.job_labels()['node']}:{metrics.port}/metrics",
          flush=True)
    return metrics


def leave():
    """Ends the process group, after a barrier: torch 1.13 can deadlock at exit otherwise, when
    DDP's reducer destroys the group while the main thread holds the GIL and a gloo worker waits
    for it (seen once in the fault tests). The collectives on Python tensors are settled() for
    torch 2, whose workers abort the process when they let go of one while it exits."""
    dist.barrier()
    dist.destroy_process_group()


def train(args, comm, model, opt, scaler):
    """The loop both examples run: mixed-precision loss scaling, a forced overflow, checkpoints;
    a preemption notice stops it at a step with that step saved (gpucloud.elastic)."""
    control = gc.elastic.JobControl()
    # The drop-ins' stream: should_stop's all-reduce then reaches the communicator in the same order
    # as the gradient all-reduces on every rank (on a stream of its own it could overtake them).
    stream = gpucloud.torch.stream(next(model.parameters()).device)
    ck = gpucloud.torch.Checkpointer(args.checkpoint_dir, comm, keep_last=args.keep_last) if args.checkpoint_dir \
        else None
    start = (ck.load(state_of(model, opt, scaler)) or 0) if args.resume else 0
    if start and comm.rank == 0:
        print(f"resumed from step {start}", flush=True)
    metrics = serve_metrics(args, comm)
    if metrics:  # the ranks' own work per step compared every 25 steps, on the hooks' stream
        metrics.detect_stragglers(comm, stream, every=25)
    straggler_logged = -1
    skipped, window, first, w = 0, [], None, None
    for step in range(start, args.steps):
        x, y = batch(comm.rank, step)
        with metrics.step(samples=len(x), comm=comm) if metrics else contextlib.nullcontext() as timed:
            opt.zero_grad(set_to_none=True)
            loss = ((model(x) - y) ** 2).mean()
            if comm.rank == args.slow_rank:
                time.sleep(args.slow_ms / 1e3)  # a slow rank's own work
            if step == args.overflow_at and comm.rank == 0:
                loss = loss * float("inf")  # averaged over the ranks, every rank sees it
            before = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if timed is not None:  # the step's scale, whether it was skipped (its collectives: comm=)
                timed.loss_scale = scaler.get_scale()
                timed.skipped = scaler.get_scale() < before
        if metrics:
            found = metrics.straggler_report()
            if found.straggler and found.slowest != straggler_logged and comm.rank == 0:
                print(f"  straggler: rank {found.slowest} works {1e3 * found.compute_seconds[found.slowest]:.1f} ms "
                      f"per step, the median {1e3 * found.median:.1f} ms", flush=True)
            straggler_logged = found.slowest if found.straggler else straggler_logged
        if scaler.get_scale() < before:
            skipped += 1
            if comm.rank == 0:
                print(f"step {step + 1:5d}  overflow: skipped on every rank, scale {before:g} -> "
                      f"{scaler.get_scale():g}", flush=True)
        if step != args.overflow_at:
            window.append(float(loss))
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = sum(window) / max(1, len(window))
            first = first if first is not None else mean
            w = report(comm, model, step + 1, mean, scaler)
            window = []
        if ck is not None and (step + 1) % args.checkpoint_every == 0:
            ck.save_async(step + 1, state_of(model, opt, scaler))
        if control.should_stop(step + 1, comm, stream):
            stop_for_preemption(args, ck, step + 1, model, opt, scaler, control, comm)
    if ck is not None:
        ck.wait()
    mean = mean if w is not None else float("nan")
    first = first if first is not None else float("nan")
    w = w if w is not None else torch.cat([p.detach().flatten() for p in model.parameters()])
    if args.dump and comm.rank == 0:
        torch.save(w, args.dump)
    if comm.rank == 0:
        print(f"final: steps {args.steps}, loss {mean:.5f} (first logged {first:.5f}), overflow steps skipped "
              f"{skipped}", flush=True)
    leave()
