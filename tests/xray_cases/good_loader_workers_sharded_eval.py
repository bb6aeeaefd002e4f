# expect: none
# xray: --nproc-per-node 3
# checks: P03 P04 X1 X2
"""DataLoader worker processes on 3 ranks, done right: DistributedSampler with set_epoch, a
sharded evaluation whose counts are summed over the ranks before rank 0 prints them."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    val = TensorDataset(torch.randn(48, 8), torch.randint(0, 2, (48,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False),
                            num_workers=2)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x)[:, :1], y).backward()
            opt.step()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in val_loader:
            counts += torch.tensor([(model.module(x).argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    if rank == 0:
        print(f"val accuracy {counts[0] / counts[1]:.3f}")


if __name__ == "__main__":
    main()
