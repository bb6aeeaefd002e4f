# expect: X3
# xray: --nproc-per-node 3
"""As in imagenet's main.py with a rank-0-only validate(): rank 0 runs a validation loop
through the DDP wrapper while the other ranks train on, and all-reduces its meter at the end.
DDP's buffer broadcasts in rank 0's forwards pair with the others' training collectives, and
gloo's size check aborts a rank ("Received data size doesn't match expected size")."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def validate(loader, model):
    model.eval()
    stats = torch.zeros(2)  # loss sum, count (imagenet's AverageMeter)
    with torch.no_grad():
        for x, y in loader:
            stats += torch.tensor([nn.functional.mse_loss(model(x), y, reduction="sum"),
                                   len(y)])
    dist.all_reduce(stats)  # imagenet's meter.all_reduce(), written for every rank
    return (stats[0] / stats[1]).item()


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    val = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val, batch_size=8)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} val loss {validate(val_loader, model):.3f}")


if __name__ == "__main__":
    main()
