# expect: none
# checks: P03 P04 P16
"""A typical DDP training script: sharded data with set_epoch, AdamW with a schedule,
gradient clipping, bf16 autocast, an evaluation reduced over ranks, and a checkpoint
per epoch written by rank 0 behind a barrier."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model, loader):
    totals = torch.zeros(2)
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            totals += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    model.train()
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(256, 20), torch.randint(0, 3, (256,)))
    val = TensorDataset(torch.randn(64, 20), torch.randint(0, 3, (64,)))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val, batch_size=32, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.LayerNorm(64), nn.GELU(),
                              nn.Dropout(0.1), nn.Linear(64, 3)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3 * len(loader))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
        accuracy = evaluate(model, val_loader)
        if rank == 0:
            torch.save({"model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict(), "epoch": epoch}, "last.pt")
            print(f"epoch {epoch}: val accuracy {accuracy:.3f}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
