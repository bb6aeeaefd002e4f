# expect: none
# checks: TP4 TP9
"""Tensor parallelism done right, picotron-style: every rank is in one tensor-parallel
group, so there is one data-parallel replica, and the sampler is told so (num_replicas=1):
both ranks read the same batch every step, in the same shuffled order.
Gradients are clipped over the DTensor and plain parameters together inside
implicit_replication(), which counts the plain ones once."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TinyLM(nn.Module):
    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.feed_forward = FeedForward(dim, 4 * dim)
        self.output = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        return self.output(h + self.feed_forward(h))


dist.init_process_group("gloo")
tp_mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)
model = TinyLM()
model = parallelize_module(model, tp_mesh, {"feed_forward.w1": ColwiseParallel(),
                                            "feed_forward.w2": RowwiseParallel()})

tokens = torch.randint(0, 32, (257,), generator=torch.Generator().manual_seed(1))
data = TensorDataset(tokens[:-1], tokens[1:])
dp_size, dp_rank = 1, 0  # every rank is in the one tensor-parallel group: one replica
sampler = DistributedSampler(data, num_replicas=dp_size, rank=dp_rank)
loader = DataLoader(data, batch_size=16, sampler=sampler)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        with implicit_replication():  # the plain parameters are the same on every rank
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}")
