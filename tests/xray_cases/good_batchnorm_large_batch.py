# expect: none
# checks: P05
"""Plain BatchNorm with 64 samples per rank (enough for stable batch statistics), and an
evaluation in eval mode with small batches (running statistics, no batch statistics)."""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(
        nn.Linear(20, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2)))
    data = TensorDataset(torch.randn(512, 20), torch.randint(0, 2, (512,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    model.eval()
    correct = torch.zeros(2)
    val = TensorDataset(torch.randn(64, 20), torch.randint(0, 2, (64,)))
    val_loader = DataLoader(val, batch_size=4, sampler=DistributedSampler(val, shuffle=False))
    with torch.no_grad():
        for x, y in val_loader:
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(correct)
    if dist.get_rank() == 0:
        print(f"val accuracy {correct[0] / correct[1]:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
