"""Run under mpirun by test_torch_dropins.py: Horovod's API over gpucloud. DistributedOptimizer
(torch's SGD, and gpucloud's AdamW with the GradScaler) against DDP over gloo on the same shards;
broadcast_parameters and broadcast_optimizer_state from rank 0.

    mpi_torch_horovod.py PORT
"""
import contextlib
import io
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gpucloud as gc
import gpucloud.torch as gt
from torch_ranks import all_gathered, same_on_every_rank


class _RunsCode:
    """Unpickling it creates a file: the proof that a pickle from the root ran code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def send_raw(comm, description, data_bytes):
    """Rank 0's side of broadcast_optimizer_state's wire format, with @p description as it is."""
    from gpucloud.torch._streams import stream_for

    stream = stream_for(torch.device("cpu"))
    comm.broadcast(torch.tensor([len(description), data_bytes], dtype=torch.int64), 0, stream)
    comm.broadcast(torch.frombuffer(bytearray(description), dtype=torch.uint8), 0, stream)
    comm.broadcast(torch.zeros(data_bytes, dtype=torch.uint8), 0, stream)
    stream.synchronize()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def shard(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train(model, opt, rank, steps=20, scaler=None, set_to_none=True, sched=None):
    x, y = shard(rank)
    for i in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss = ((model(x) - y) ** 2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            if i == 7 and rank == 1:  # one rank overflows: the average is inf, every rank skips
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        if sched is not None:
            sched.step()
    return flat(model)


def train_clipped(model, opt, rank, horovod_recipe=False, scaler=None, steps=10):
    """Clipping between backward() and step(), as a torch user writes it, or by Horovod's recipe
    (synchronize(), unscale, clip, step() under skip_synchronize())."""
    x, y = shard(rank)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if horovod_recipe:
            opt.synchronize()
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
        with opt.skip_synchronize() if horovod_recipe else contextlib.nullcontext():
            if scaler is not None:
                scaler.step(opt)
            else:
                opt.step()
        if scaler is not None:
            scaler.update()
    return flat(model)


def train_accumulated(model, opt, rank, ddp=None, steps=10):
    """Two backwards of half a batch each per step (DDP: the first under no_sync())."""
    x, y = shard(rank)
    for _ in range(steps):
        opt.zero_grad()
        for j, (xa, ya) in enumerate([(x[:16], y[:16]), (x[16:], y[16:])]):
            with ddp.no_sync() if ddp is not None and j == 0 else contextlib.nullcontext():
                (((model(xa) - ya) ** 2).mean() / 2).backward()
        opt.step()
    return flat(model)


def main():
    comm = gc.Communicator.mpi_world()
    gt.init_process_group(comm, "gloo")  # its rendezvous over comm
    rank = comm.rank

    ddp = DDP(make_model())
    reference = train(ddp, torch.optim.SGD(ddp.parameters(), 0.05, momentum=0.9), rank)
    ddp = DDP(make_model())
    clipped = train_clipped(ddp, torch.optim.SGD(ddp.parameters(), 0.05, momentum=0.9), rank)
    ddp = DDP(make_model())
    accumulated = train_accumulated(ddp, torch.optim.SGD(ddp.parameters(), 0.05, momentum=0.9), rank, ddp=ddp)
    del ddp  # torch 1.13: a DDP module freed after destroy_process_group() can hang in its reducer

    # Clipping after backward() applies to the averaged gradients, as under DDP: written the torch
    # way, and by Horovod's AMP recipe (synchronize, unscale, clip, step under skip_synchronize).
    for recipe in (False, True):
        model = make_model()
        opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.05, momentum=0.9), comm,
                                      first_bucket_bytes=4096, bucket_bytes=8192)
        w = train_clipped(model, opt, rank, horovod_recipe=recipe, scaler=gt.GradScaler() if recipe else None)
        diff = (w - clipped).abs().max().item()
        assert diff <= 1e-6, f"clipped (Horovod's recipe: {recipe}): worst weight difference to DDP {diff}"
    # backward_passes_per_step: two backwards accumulated, averaged once (DDP: no_sync, then sync).
    model = make_model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.05, momentum=0.9), comm,
                                  backward_passes_per_step=2, first_bucket_bytes=4096, bucket_bytes=8192)
    diff = (train_accumulated(model, opt, rank) - accumulated).abs().max().item()
    assert diff <= 1e-6, f"backward_passes_per_step=2: worst weight difference to DDP {diff}"
    # One backward more than backward_passes_per_step before step(): refused, not averaged twice.
    model = make_model()
    opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.05), comm)
    x, y = shard(rank)
    ((model(x) - y) ** 2).mean().backward()
    try:
        ((model(x) - y) ** 2).mean().backward()
        raise AssertionError("a second backward before step() was accepted")
    except gc.InvalidArgument as e:
        assert "backward_passes_per_step" in str(e), e
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()  # a new step after zero_grad()
    opt.step()
    worst = 0.0
    for set_to_none in (True, False):
        model = make_model()
        opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), 0.05, momentum=0.9), comm,
                                      named_parameters=model.named_parameters(), first_bucket_bytes=4096,
                                      bucket_bytes=8192)
        assert isinstance(opt, torch.optim.SGD)
        w = train(model, opt, rank, set_to_none=set_to_none)
        assert same_on_every_rank(w)
        worst = max(worst, (w - reference).abs().max().item())
    assert worst <= 1e-6, f"DistributedOptimizer vs DDP over gloo: worst weight difference {worst}"

    # gpucloud's AdamW and GradScaler, a scheduler made afterwards, hierarchical buckets.
    model = make_model()
    opt = gt.DistributedOptimizer(gt.optim.AdamW(model.parameters(), 1e-2), comm, hierarchical=True)
    scaler = gt.GradScaler()
    w = train(model, opt, rank, scaler=scaler, sched=torch.optim.lr_scheduler.ExponentialLR(opt, 0.9))
    assert same_on_every_rank(w) and torch.isfinite(w).all()
    assert scaler.get_scale() == 2.0**15, scaler.get_scale()
    assert float(opt.state_dict()["state"][0]["step"]) == 19.0  # the overflow step was skipped everywhere

    # Broadcasts: every rank starts from its own weights and state; after them, rank 0's everywhere.
    model = make_model(seed=rank)
    opt = torch.optim.AdamW(model.parameters(), 1e-3 * (rank + 1))
    if rank == 0:
        train(model, opt, rank, steps=3)
    gt.broadcast_parameters(model.state_dict(), comm, root=0)
    # Buffers of every dtype a model keeps (bool masks, int8, float64, complex), and a transposed
    # (non-contiguous) tensor: each becomes rank 0's, bit for bit.
    g = torch.Generator().manual_seed(rank)
    buffers = {"mask": torch.rand(7, generator=g) > 0.5, "i8": torch.randint(-100, 100, (5,), generator=g).to(torch.int8),
               "f64": torch.randn(3, generator=g, dtype=torch.float64), "c64": torch.randn(4, generator=g, dtype=torch.complex64),
               "t": torch.randn(3, 5, generator=g).t(), "count": torch.tensor(rank + 10)}
    gt.broadcast_parameters(buffers, comm, root=0)
    for key, value in buffers.items():
        everyone = all_gathered(value.contiguous().reshape(-1).view(torch.uint8).clone())
        assert all(torch.equal(everyone[0], o) for o in everyone), key
    gt.broadcast_optimizer_state(opt, comm, root=0)
    assert same_on_every_rank(flat(model))
    assert opt.param_groups[0]["lr"] == 1e-3 and float(opt.state_dict()["state"][0]["step"]) == 3.0
    assert same_on_every_rank(opt.state_dict()["state"][0]["exp_avg"].flatten())
    assert isinstance(opt.param_groups[0]["betas"], tuple)  # plain data keeps its types

    # A compromised or corrupt root: what it sends is data, never code. Rank 0 speaks the wire
    # format by hand; every other rank must raise CommunicationError, and nothing may run.
    canary = f"/tmp/gpucloud_canary_{sys.argv[1]}"
    pickled = io.BytesIO()
    torch.save({"x": _RunsCode(canary)}, pickled)
    hostile = [
        pickled.getvalue(),                                   # the old format: a pickle
        b"{ not json",
        json.dumps({"state_dict": {"__dict__": []}, "tensors": [{"dtype": "load", "shape": [1]}]}).encode(),
        json.dumps({"state_dict": {"__tensor__": 0}, "tensors": [{"dtype": "float32", "shape": [10**6]}]}).encode(),
        json.dumps({"state_dict": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], "tensors": []}).encode(),
        ("[" * 100000 + "]" * 100000).encode(),
        json.dumps({"state_dict": 5, "tensors": []}).encode(),
    ]
    for i, payload in enumerate(hostile):
        if rank == 0:
            send_raw(comm, payload, data_bytes=16)
        else:
            try:
                gt.broadcast_optimizer_state(opt, comm, root=0)
                raise AssertionError(f"hostile payload {i} was accepted")
            except gc.CommunicationError as e:
                assert "malformed" in str(e), (i, e)
        assert not os.path.exists(canary), "the root's payload ran code"
    assert opt.param_groups[0]["lr"] == 1e-3  # the state is unchanged
    if rank == 0:
        print(f"torch horovod-style API on {comm.size} ranks ({comm.nodes} nodes): ok, worst difference to DDP "
              f"{worst:.1e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
