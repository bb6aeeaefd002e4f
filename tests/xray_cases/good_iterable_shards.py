# expect: none
"""An IterableDataset that yields only this rank's share of a stream, logged with the
logging module on rank 0 only."""

import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

log = logging.getLogger("train")


class Stream(IterableDataset):
    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def __iter__(self):
        gen = torch.Generator().manual_seed(0)  # every rank sees the same stream ...
        for i in range(128):
            x, y = torch.randn(8, generator=gen), torch.randn(1, generator=gen)
            if i % self.world == self.rank:  # ... and keeps its own share of it
                yield x, y


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Stream(rank, world), batch_size=8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    log.info("last loss %.4f", loss.item())


if __name__ == "__main__":
    main()
