# expect: cannot judge
# first line: Cannot run here: the script's own argument parser stopped it at {script}:41 (the
#   following arguments are required: DIR)
"""pytorch/examples imagenet/main.py's start, with the dataset folder as a required
positional argument, and the x-ray given none (argparse exits with status 2)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("data", metavar="DIR", help="path to dataset")
parser.add_argument("--epochs", default=2, type=int, metavar="N",
                    help="number of total epochs to run")
parser.add_argument("-b", "--batch-size", default=32, type=int, metavar="N")
parser.add_argument("--dist-backend", default="gloo", type=str)


def main_worker(args):
    dist.init_process_group(backend=args.dist_backend)
    data = TensorDataset(torch.randn(256, 3, 8, 8), torch.randint(0, 10, (256,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(192, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, target in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), target).backward()
            optimizer.step()
    dist.destroy_process_group()


def main():
    args = parser.parse_args()
    if not os.path.isdir(args.data):
        raise FileNotFoundError(args.data)
    main_worker(args)


if __name__ == "__main__":
    main()
