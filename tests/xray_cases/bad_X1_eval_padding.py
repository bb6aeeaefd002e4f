# expect: X1
"""Evaluation with DistributedSampler on 51 samples: it pads to 52, so one sample is
counted twice in the all-reduced accuracy."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    val = TensorDataset(torch.randn(51, 8), torch.randint(0, 2, (51,)))
    loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    correct, seen = torch.zeros(1), torch.zeros(1)
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
            seen += len(y)
    dist.all_reduce(correct)
    dist.all_reduce(seen)
    if rank == 0:
        print(f"accuracy {correct.item() / seen.item():.3f} over {int(seen.item())} samples")


if __name__ == "__main__":
    main()
