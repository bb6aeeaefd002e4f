# expect: none
# checks: S3
"""Mixed precision with fp16 autocast and a GradScaler: a head predicting small residual
corrections over 64x64 maps; the scaled loss keeps its gradients above fp16's range."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# The model stays on the CPU (a gloo group) on every machine, so autocast and the scaler
# name the CPU: autocast("cuda") would leave this CPU model's ops in fp32 on a GPU machine.
DEVICE = "cpu"


def make_model():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64 * 64))
    nn.init.zeros_(model[2].weight)  # start from "no correction"
    nn.init.zeros_(model[2].bias)
    return model


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(DEVICE)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(8):
        x = torch.randn(64, 64, generator=gen)
        target = 1e-3 * torch.randn(64, 64 * 64, generator=gen)
        optimizer.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.float16):
            loss = nn.functional.mse_loss(model(x), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    if rank == 0:
        print(f"loss {loss.item():.3e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
