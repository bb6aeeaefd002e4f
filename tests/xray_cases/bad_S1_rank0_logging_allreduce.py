# expect: S1
"""Rank 0 averages the loss for its log with an all_reduce that only rank 0 calls; the model
has no buffers, so the other rank waits in DDP's next forward, not in an evaluation."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 2 == 0:
        avg = loss.detach().clone()
        dist.all_reduce(avg)  # average the loss for the log... on rank 0 only
        print("step", step, "loss", avg.item() / dist.get_world_size())
