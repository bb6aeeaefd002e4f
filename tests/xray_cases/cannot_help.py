# expect: cannot judge
# args: --help
# first line: The script exited before training: its argument parser exited (it printed its usage or
#   help) at {script}:30 on every rank
"""A script whose only argument was --help: argparse prints the usage and exits (status 0)
before anything trains (pytorch/examples' scripts all start with an ArgumentParser)."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def train(args):
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for _ in range(args.steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="toy DDP training")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps")
    train(parser.parse_args())
