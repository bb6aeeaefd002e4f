# expect: none
"""DDP with ZeroRedundancyOptimizer: each rank keeps the optimizer state of its shard of
the parameters and steps it; ZeRO broadcasts the updated shards so replicas stay equal."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 4)))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        print("trained 5 steps with ZeRO")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
