# expect: none
# checks: P15
"""Checkpointing done right: rank 0 saves the unwrapped model's state_dict, a barrier waits
for the file, then every rank loads it with map_location into the wrapped model's module."""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))


def main():
    rank = int(os.environ["RANK"])
    ckpt = sys.argv[1] if len(sys.argv) > 1 else "checkpoint.pt"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for _ in range(3):
            x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        if rank == 0:
            torch.save({"model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(), "epoch": epoch}, ckpt)
        dist.barrier()
        state = torch.load(ckpt, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    dist.barrier()  # nobody deletes or rewrites the file while another rank still reads it
    if rank == 0:
        eval_model = make_model()
        eval_model.load_state_dict(torch.load(ckpt, map_location="cpu")["model"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
