# expect: none
"""DataLoader worker processes (persistent), DistributedSampler with set_epoch, a full
evaluation on every rank (unsharded, so each rank's number is the whole set's), one
start-up line per rank and the log on rank 0."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    print(f"rank {rank} of {dist.get_world_size()} started")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    val = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    sampler = DistributedSampler(data, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2,
                        persistent_workers=True)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            val_loss = sum(torch.nn.functional.mse_loss(model.module(x), y, reduction="sum")
                           for x, y in DataLoader(val, batch_size=8)) / len(val)
        if rank == 0:
            print(f"epoch {epoch} val loss {val_loss.item():.4f}")


if __name__ == "__main__":
    main()
