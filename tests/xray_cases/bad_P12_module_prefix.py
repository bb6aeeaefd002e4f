# expect: P12
"""Checkpoint saved from the DDP wrapper, later loaded into a plain model for evaluation."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))


def main():
    rank = int(os.environ["RANK"])
    ckpt = sys.argv[1] if len(sys.argv) > 1 else "model.pt"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.state_dict(), ckpt)
    dist.barrier()
    eval_model = make_model()
    eval_model.load_state_dict(torch.load(ckpt, map_location="cpu"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
