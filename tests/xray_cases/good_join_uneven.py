# expect: none
# checks: P20
"""Shards of unequal size trained under model.join(): the rank that runs out of batches
shadows the others' all-reduces, so nothing hangs."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(66, 8), torch.randn(66, 1))
    shard = Subset(data, range(rank * 40, min(len(data), (rank + 1) * 40)))
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with model.join():
        for x, y in DataLoader(shard, batch_size=8, shuffle=True):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
