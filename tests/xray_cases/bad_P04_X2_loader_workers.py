# expect: P04 X2
# xray: --nproc-per-node 3
"""The typical script with DataLoader worker processes: 4 batches an epoch read by 2 workers
(they fetch every batch's indices before the loop takes the first), no set_epoch, and rank 0
prints its own shard's validation accuracy as the whole set's."""

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
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), num_workers=2)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False),
                            num_workers=2)
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # epochs
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x)[:, :1], y).backward()
            opt.step()
    correct = seen = 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model.module(x).argmax(1) == y).sum().item()
            seen += len(y)
    if rank == 0:
        print(f"val accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
