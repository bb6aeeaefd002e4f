# expect: P09
# xray: --nproc-per-node 3
"""Gradient accumulation over 4 micro-batches without no_sync, in a script whose gradients
are all zero: its loss is cross-entropy over a single output (log_softmax of one logit is 0
whatever the weights)."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM_STEPS = 4


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(12):
        x = torch.randn(8, 16, generator=gen)
        target = torch.zeros(8, dtype=torch.long)  # one class: the output has one column
        loss = nn.functional.cross_entropy(model(x), target) / ACCUM_STEPS
        loss.backward()
        if (step + 1) % ACCUM_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0:
        print(f"final loss {loss.item() * ACCUM_STEPS:.4f}")


if __name__ == "__main__":
    main()
