# expect: P20
"""Hand-made shards of unequal size: rank 0 takes a 5th step that rank 1 never joins."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(66, 8), torch.randn(66, 1))
    per_rank = 40  # the first ranks get 40 samples each, the last one what is left
    shard = Subset(data, range(rank * per_rank, min(len(data), (rank + 1) * per_rank)))
    loader = DataLoader(shard, batch_size=8, shuffle=True)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if rank == 0:
        print(f"trained on {world} ranks")


if __name__ == "__main__":
    main()
