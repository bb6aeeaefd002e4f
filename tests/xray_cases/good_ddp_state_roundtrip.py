# expect: none
# checks: P12
"""A checkpoint of the DDP wrapper's state_dict ('module.' keys) loaded back into the
wrapper, and each rank's own RNG state saved to and loaded from its own file."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.save(torch.get_rng_state(), f"rng_rank{rank}.pt")
    if rank == 0:
        torch.save(model.state_dict(), "ddp_model.pt")
    dist.barrier()
    model.load_state_dict(torch.load("ddp_model.pt", map_location="cpu"))
    torch.set_rng_state(torch.load(f"rng_rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
