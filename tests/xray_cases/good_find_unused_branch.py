# expect: none
# checks: P10
"""find_unused_parameters=True where it is needed: the auxiliary head runs only on every
other step, so some parameters get no gradient in some iterations."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        self.aux_head = nn.Linear(64, 1)

    def forward(self, x, with_aux):
        h = self.body(x)
        aux = self.aux_head(h).mean() if with_aux else torch.zeros(())
        return self.head(h), aux


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(Net(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(6):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        optimizer.zero_grad()
        logits, aux = model(x, with_aux=step % 2 == 0)
        (nn.functional.cross_entropy(logits, y) + 0.1 * aux).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
