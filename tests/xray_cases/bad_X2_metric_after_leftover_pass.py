# expect: X2
# xray: --nproc-per-node 3
"""As imagenet's validate(): each rank evaluates its shard (drop_last), then every rank makes
an extra pass over the leftover samples; rank 0 prints its own accuracy as the whole set's
(the meters' all_reduce is missing)."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def evaluate(model, loader):
    correct = seen = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
    return correct, seen


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    val = TensorDataset(torch.randn(50, 8), torch.randint(0, 2, (50,)))
    sampler = DistributedSampler(val, shuffle=False, drop_last=True)
    correct, seen = evaluate(model, DataLoader(val, batch_size=8, sampler=sampler))
    done = len(sampler) * world
    if done < len(val):  # the samples drop_last left out, on every rank
        leftover = DataLoader(Subset(val, range(done, len(val))), batch_size=8)
        extra_correct, extra_seen = evaluate(model, leftover)
        correct, seen = correct + extra_correct, seen + extra_seen
    if rank == 0:
        print(f"val accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
