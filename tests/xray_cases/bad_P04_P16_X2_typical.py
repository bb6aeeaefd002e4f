# expect: P04 P16 X2
"""A typical first DDP script with three bugs: no set_epoch(), every rank prints the
training log, and rank 0 reports its own validation accuracy as the whole set's."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(256, 16), torch.randint(0, 2, (256,)))
    val = TensorDataset(torch.randn(128, 16), torch.randint(0, 2, (128,)))
    train_loader = DataLoader(train, batch_size=16, sampler=DistributedSampler(train))
    val_loader = DataLoader(val, batch_size=32, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: train loss {loss.item():.3f}")
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {100 * correct / total:.1f}%")


if __name__ == "__main__":
    main()
