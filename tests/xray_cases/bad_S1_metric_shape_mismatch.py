# expect: S1
# xray: --nproc-per-node 3
"""Each rank evaluates its own slice of 50 samples (17, 17 and 16) and all-reduces its
per-sample losses, whose length differs on the last rank: gloo's size check aborts a rank
("Received data size doesn't match expected size ... collective mismatch")."""

import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    x, y = torch.randn(50, 8), torch.randn(50, 1)
    mine = slice(rank, None, world)  # 17, 17, 16 samples
    with torch.no_grad():
        losses = torch.nn.functional.mse_loss(model(x[mine]), y[mine], reduction="none")
    dist.all_reduce(losses.flatten())
    if rank == 0:
        print(f"mean loss {losses.mean().item():.3f}")


if __name__ == "__main__":
    main()
