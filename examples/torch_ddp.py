#!/usr/bin/env python3
"""A torch model trained with DistributedDataParallel, gradients averaged by gpucloud's all-reduce
through a DDP communication hook, gpucloud's fused AdamW and its GradScaler, and gpucloud
checkpoints. Against a plain torch DDP script the changes are these lines:

    model.register_comm_hook(gpucloud.torch.ddp.HookState(comm), gpucloud.torch.ddp.allreduce_hook)
    opt = gpucloud.torch.optim.AdamW(model.parameters(), lr)      # was torch.optim.AdamW
    scaler = gpucloud.torch.GradScaler()                           # was torch.cuda.amp.GradScaler

    mpirun -np 2 python examples/torch_ddp.py [--steps 300] [--checkpoint-dir DIR [--resume]]
"""
from torch.nn.parallel import DistributedDataParallel as DDP

import gpucloud.torch as gt
import torch_support as support


def main():
    args = support.arguments(__doc__)
    comm = support.start_job()
    model = DDP(support.make_model())
    model.register_comm_hook(gt.ddp.HookState(comm), gt.ddp.allreduce_hook)
    opt = gt.optim.AdamW(model.parameters(), args.lr)
    support.train(args, comm, model, opt, gt.GradScaler())


if __name__ == "__main__":
    main()
