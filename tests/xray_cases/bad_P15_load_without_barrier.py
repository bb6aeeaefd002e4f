# expect: P15
"""Rank 0 saves a checkpoint and every rank reloads it at once, with no barrier between."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    ckpt = sys.argv[1] if len(sys.argv) > 1 else "checkpoint.pt"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 3
    for _ in range(steps):
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        torch.save({"model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(), "steps_done": steps}, ckpt)
    state = torch.load(ckpt, map_location="cpu")
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
