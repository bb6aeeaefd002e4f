# expect: P15
"""Rank 0 writes the trained weights for an evaluation that rank 1 runs at once, with no
barrier: rank 1 may read a missing, half-written or older file."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(3):
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        torch.save(model.module.state_dict(), "for_eval.pt")
    elif rank == 1:
        evaluator = make_model()
        evaluator.load_state_dict(torch.load("for_eval.pt", map_location="cpu"))
        with torch.no_grad():
            print(f"eval loss {evaluator(torch.randn(64, 256)).logsumexp(1).mean():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
