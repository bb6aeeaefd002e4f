# expect: P03 TP8
# xray: --nproc-per-node 4
"""Data x tensor parallelism, 2 x 2 on 4 ranks: the sampler is cut by the wrong mesh
dimension, mesh["tp"] where it should be mesh["dp"]. So the two ranks of a tensor-parallel
group read different halves of the data, and the two replicas read the same halves as
each other (ranks 0 and 2, ranks 1 and 3)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
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
world_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = TinyLM()
parallelize_module(model, world_mesh["tp"], {"feed_forward.w1": ColwiseParallel(),
                                             "feed_forward.w2": RowwiseParallel()})
fully_shard(model, mesh=world_mesh["dp"])

tokens = torch.randint(0, 32, (129,), generator=torch.Generator().manual_seed(1))
data = TensorDataset(tokens[:-1], tokens[1:])
tp_mesh = world_mesh["tp"]
sampler = DistributedSampler(data, num_replicas=tp_mesh.size(), rank=tp_mesh.get_local_rank())
loader = DataLoader(data, batch_size=16, sampler=sampler)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        loss = F.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}")
