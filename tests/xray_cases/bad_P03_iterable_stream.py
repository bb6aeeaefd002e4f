# expect: P03
"""An IterableDataset that every rank reads whole: the same samples on every rank."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __iter__(self):
        gen = torch.Generator().manual_seed(0)
        for _ in range(64):
            yield torch.randn(8, generator=gen), torch.randn(1, generator=gen)


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Stream(), batch_size=8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


if __name__ == "__main__":
    main()
