# expect: none
"""FSDP2 (fully_shard) on a CPU mesh: each rank holds a shard of every parameter, so the
ranks' local parameters differ by design; gradients are reduce-scattered."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        print("trained 4 steps with FSDP2")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
