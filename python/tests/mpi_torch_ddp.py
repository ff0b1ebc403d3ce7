"""Run under mpirun by test_torch_dropins.py: DDP (gloo process group) trained with its default
all-reduce and with gpucloud's hooks registered, on the same data; then the same with gpucloud's
AdamW and GradScaler. Every rank must end with the same weights, and the hooks' with gloo's.

    mpi_torch_ddp.py PORT
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gpucloud as gc
import gpucloud.torch as gt
from gpucloud.torch import ddp as gddp
from torch_ranks import same_on_every_rank


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def train(rank, hook=None, state=None, optimizer="sgd", scaler=None, steps=20):
    model = DDP(make_model(), bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = (torch.optim.SGD(model.parameters(), 0.05, momentum=0.9) if optimizer == "sgd"
           else gt.optim.AdamW(model.parameters(), 1e-2))
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - y) ** 2).mean()
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            if i == 7 and rank == 1:  # an overflow on one rank: the average is inf, every rank skips
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    port = int(sys.argv[1])
    comm = gc.Communicator.mpi_world()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)
    rank = comm.rank
    gloo = train(rank)
    state = gddp.HookState(comm)
    ring = train(rank, gddp.allreduce_hook, state)
    assert state.calls >= 20, state.calls  # every step's buckets went through gpucloud
    hier = train(rank, gddp.hierarchical_allreduce_hook, gddp.HookState(comm))
    bf16 = train(rank, gddp.allreduce_hook, gddp.HookState(comm, wire_dtype=torch.bfloat16))
    for name, w in (("gloo", gloo), ("ring", ring), ("hierarchical", hier), ("bf16", bf16)):
        assert same_on_every_rank(w), f"{name}: the ranks' weights differ"
    worst = max((ring - gloo).abs().max().item(), (hier - gloo).abs().max().item())
    assert worst <= 1e-6, f"gpucloud's hooks vs gloo's all-reduce: worst weight difference {worst}"
    assert (bf16 - gloo).abs().max().item() < 5e-2, (bf16 - gloo).abs().max().item()
    assert not torch.equal(bf16, gloo), "bf16 on the wire must round something"
    scaler = gt.GradScaler()
    fused = train(rank, gddp.allreduce_hook, gddp.HookState(comm), optimizer="adamw", scaler=scaler)
    assert same_on_every_rank(fused) and torch.isfinite(fused).all()
    assert scaler.get_scale() == 2.0**15, scaler.get_scale()  # backed off once, on every rank
    if rank == 0:
        print(f"torch ddp hooks on {comm.size} ranks ({comm.nodes} nodes): ok, worst difference to gloo {worst:.1e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
