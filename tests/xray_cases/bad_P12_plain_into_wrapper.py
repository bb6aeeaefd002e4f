# expect: P12
"""Resuming: the checkpoint was saved from the unwrapped model, and is loaded into the DDP
wrapper, whose keys all start with 'module.'."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    if rank == 0:
        torch.save(make_model().state_dict(), "pretrained.pt")  # from an earlier run
    dist.barrier()
    model = DDP(make_model())
    model.load_state_dict(torch.load("pretrained.pt", map_location="cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
