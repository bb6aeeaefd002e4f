# expect: P03
# xray: --nproc-per-node 3
"""Every rank shuffles the whole dataset itself (no DistributedSampler), read by 3 DataLoader
worker processes on each rank."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 8), torch.randn(48, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=3)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if rank == 0:
        print("done")


if __name__ == "__main__":
    main()
