# expect: P03
# xray: --nproc-per-node 4
"""Written for one machine, run on two: the sampler is told the local rank and the local
world size, so on 2 "nodes" x 2 ranks, rank 0 and rank 2 read the same half of the data
(and rank 1 and rank 3 the other half). Each rank's sampler looks right on its own."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
local_rank = int(os.environ["RANK"]) % 2  # LOCAL_RANK on a 2-rank node
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
sampler = DistributedSampler(data, num_replicas=2, rank=local_rank)
loader = DataLoader(data, batch_size=16, sampler=sampler)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
