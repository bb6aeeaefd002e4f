# expect: cannot judge
# first line: The script ended before training: every rank returned without a DDP forward, an
#   optimizer step, a DataLoader batch or a collective, after printing 'Namespace(epochs=3, lr=0.1)'
"""A script that only parses its arguments: main(args) is defined, but the `__main__` block
prints the arguments and never calls it."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args):
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for _ in range(args.epochs):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    print(args)
