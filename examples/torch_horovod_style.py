#!/usr/bin/env python3
"""A torch model trained Horovod's way (no DDP): gpucloud's DistributedOptimizer averages gradients
through gradient buckets while backward runs, parameters and optimizer state are broadcast from
rank 0 at the start, with gpucloud's fused AdamW, GradScaler and checkpoints. Against a Horovod
script the changes are these lines:

    opt = gpucloud.torch.DistributedOptimizer(opt, comm, named_parameters=model.named_parameters())
    gpucloud.torch.broadcast_parameters(model.state_dict(), comm, root=0)
    gpucloud.torch.broadcast_optimizer_state(opt, comm, root=0)

    mpirun -np 2 python examples/torch_horovod_style.py [--steps 300] [--checkpoint-dir DIR [--resume]]
"""
import gpucloud.torch as gt
import torch_support as support


def main():
    args = support.arguments(__doc__)
    comm = support.start_job()
    model = support.make_model()
    opt = gt.DistributedOptimizer(gt.optim.AdamW(model.parameters(), args.lr), comm,
                                  named_parameters=model.named_parameters())
    gt.broadcast_parameters(model.state_dict(), comm, root=0)
    gt.broadcast_optimizer_state(opt, comm, root=0)
    support.train(args, comm, model, opt, gt.GradScaler())


if __name__ == "__main__":
    main()
