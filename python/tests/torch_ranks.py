"""What the mpirun torch scripts (mpi_torch_*.py) check across ranks, over torch's gloo group."""
import torch
import torch.distributed as dist

import gpucloud.torch as gt


def all_gathered(w):
    """``w`` of every rank, in rank order."""
    everyone = [torch.empty_like(w) for _ in range(dist.get_world_size())]
    with gt.settled(everyone, w):  # gloo lets go of them before this returns (torch 2 aborts at exit otherwise)
        dist.all_gather(everyone, w)
    return everyone


def same_on_every_rank(w):
    """Whether every rank holds the same ``w``."""
    everyone = all_gathered(w)
    return all(torch.equal(everyone[0], o) for o in everyone)
