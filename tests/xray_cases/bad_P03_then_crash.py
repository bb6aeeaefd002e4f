# expect: P03
"""No DistributedSampler, and rank 1 crashes in the second epoch: the report gives the
crash's error, root cause first, and the finding from the epoch before it."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            if epoch == 1 and rank == 1:
                x = x[:, :4]  # a shape bug on one rank: Linear(8, 1) gets 4 features
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
