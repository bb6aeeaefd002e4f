# expect: X2
# xray: --nproc-per-node 3
"""Each rank evaluates its shard; rank 0 prints its own accuracy as the validation set's."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    val = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    if rank == 0:
        print(f"val accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
