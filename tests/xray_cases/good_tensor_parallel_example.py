# expect: none
# checks: TP4
"""PyTorch's own tensor-parallel example, shortened: a toy MLP split column-then-row over
every rank, trained on random inputs. The inputs are made inside the loop from a seed
that is the same on every rank, "to mimic the behavior of dataloader": a tensor-parallel
group must be fed the same input."""
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
for i in range(5):
    # For TP, input needs to be same across all TP ranks.
    # Setting the random seed is to mimic the behavior of dataloader.
    torch.manual_seed(i)
    inp = torch.rand(20, 10)
    output = tp_model(inp)
    output.sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"iteration {i}: output sum {output.sum().item():.4f}")
