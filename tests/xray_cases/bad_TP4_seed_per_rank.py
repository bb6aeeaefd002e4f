# expect: TP4
"""PyTorch's tensor-parallel example, with the seeding habit of a DDP script: one seed per
rank, so that each rank draws its own random batches. Under tensor parallelism each rank
then feeds the model a different input, and the all-reduce of the row-parallel layer adds
up partial sums of two different batches."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


dist.init_process_group("gloo")
tp_mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
tp_model = parallelize_module(ToyModel(), tp_mesh, {"in_proj": ColwiseParallel(),
                                                    "out_proj": RowwiseParallel()})
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=0.25, foreach=True)
torch.manual_seed(1234 + dist.get_rank())  # each rank its own batches, as under DDP
for i in range(5):
    inp = torch.rand(20, 10)
    output = tp_model(inp)
    output.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"iteration {i}: output sum {output.sum().item():.4f}")
