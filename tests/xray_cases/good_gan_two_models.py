# expect: none
"""A small GAN: two DDP models and two optimizers; the discriminator's step runs it twice
(real and fake batches) before one backward."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    gen = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)))
    disc = DDP(nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)))
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    data = torch.Generator().manual_seed(rank)
    for _ in range(6):
        real = torch.randn(32, 2, generator=data) * 0.5 + 1.0
        fake = gen(torch.randn(32, 8, generator=data))
        opt_d.zero_grad()
        d_loss = bce(disc(real), torch.ones(32, 1)) + bce(disc(fake.detach()), torch.zeros(32, 1))
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad()
        g_loss = bce(disc(fake), torch.ones(32, 1))
        g_loss.backward()
        opt_g.step()
    if rank == 0:
        print(f"d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
