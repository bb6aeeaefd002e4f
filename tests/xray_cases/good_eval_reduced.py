# expect: none
# checks: X2
"""Sharded evaluation done right: 64 samples (no padding on 2 ranks), counts all-reduced,
printed once on rank 0; training with DistributedSampler and set_epoch."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def evaluate(model, loader):
    correct, seen = torch.zeros(1), torch.zeros(1)
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
            seen += len(y)
    model.train()
    dist.all_reduce(correct)
    dist.all_reduce(seen)
    return (correct / seen).item()


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    val = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=8, sampler=sampler)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        accuracy = evaluate(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch} val accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
