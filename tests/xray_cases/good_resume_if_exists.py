# expect: none
"""The usual resume pattern: every rank loads the checkpoint at start if there is one (the
first run has none), trains, and rank 0 saves at the end while the others wait."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    ckpt = sys.argv[1] if len(sys.argv) > 1 else "resume.pt"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    start = 0
    for attempt in range(2):  # a first run, then a resumed one
        try:
            state = torch.load(ckpt, map_location="cpu")
            net.load_state_dict(state["model"])
            start = state["epoch"] + 1
        except FileNotFoundError:
            pass
        model = DDP(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(start, start + 2):
            x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": start + 1}, ckpt)
        dist.barrier()
        if rank == 0:
            print(f"run {attempt}: trained epochs {start}-{start + 1}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
