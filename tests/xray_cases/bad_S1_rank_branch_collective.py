# expect: S1
"""Rank 0 logs a global loss with an all_reduce the other ranks never call: a hang."""

import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    total = torch.zeros(1)
    for step in range(4):
        loss = torch.tensor([float(step + rank)])
        if rank == 0 and step == 2:
            dist.all_reduce(loss)  # only rank 0 gets here
            print(f"global loss {loss.item()}")
        dist.all_reduce(total)
    dist.broadcast(torch.zeros(3), src=0)


if __name__ == "__main__":
    main()
