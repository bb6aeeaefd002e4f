# expect: none
# checks: PP5 PP4
"""Pipeline training as torchtitan writes it: the loss function divides each micro-batch's
mean loss by the number of micro-batches itself, so the schedule is told not to divide
again (scale_grads=False); every stage passes a losses list, and only the last stage
logs, from what its list holds."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)] + [nn.Linear(16, 1)]
per_stage = 4 // world_size
first = rank * per_stage
last = len(layers) if rank == world_size - 1 else first + per_stage
stage_module = nn.Sequential(*layers[first:last])

stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
N_MICROBATCHES = 4


def loss_fn(output, target):
    return F.mse_loss(output, target) / N_MICROBATCHES  # this step's mean, one share of it


schedule = Schedule1F1B(stage, n_microbatches=N_MICROBATCHES, loss_fn=loss_fn, scale_grads=False)
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)

generator = torch.Generator().manual_seed(1)
for step in range(3):
    x = torch.randn(32, 16, generator=generator)
    y = x[:, :4].sum(1, keepdim=True).sin()
    optimizer.zero_grad()
    losses = []
    if stage.is_first:
        schedule.step(x, losses=losses)
    else:
        schedule.step(target=y, losses=losses)
    optimizer.step()
    if losses:  # only the last stage computes the loss
        print(f"step {step}: loss {torch.stack(losses).sum().item():.4f}")
