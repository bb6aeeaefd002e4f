# expect: PP1
# xray: --nproc-per-node 4
"""The model spread over 4 ranks, one pipeline stage each, to fit it in memory; the schedule
kept the 2 micro-batches it had on 2 ranks. Under GPipe each stage waits for the stages
before it to fill the pipeline and after it to drain it: with fewer micro-batches than
stages, every rank spends most of each step waiting."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)] + [nn.Linear(16, 1)]
per_stage = 4 // world_size
first = rank * per_stage
last = len(layers) if rank == world_size - 1 else first + per_stage
stage_module = nn.Sequential(*layers[first:last])

stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"))
schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.05)

generator = torch.Generator().manual_seed(1)
for step in range(3):
    x = torch.randn(32, 16, generator=generator)
    y = x[:, :4].sum(1, keepdim=True).sin()
    optimizer.zero_grad()
    losses = []
    if stage.is_first:
        schedule.step(x)
    elif stage.is_last:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    optimizer.step()
    if stage.is_last:
        print(f"step {step}: loss {torch.stack(losses).mean().item():.4f}")
