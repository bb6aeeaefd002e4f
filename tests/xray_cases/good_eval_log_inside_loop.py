# expect: none
# checks: X2
# xray: --nproc-per-node 3
"""A per-batch log inside the evaluation loop, on every rank, tagged with its rank (as
pytorch/examples' minGPT-ddp trainer logs "[RANK0] Epoch 1 | Iter 0 | Eval Loss ..."): with
one evaluation batch per rank the log line comes after the last batch, but still inside the
loop. It reports one batch's loss, not the ranks' evaluation result: no X2."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def run_epoch(model, loader, opt, epoch, train):
    rank = int(os.environ["RANK"])
    for it, (x, y) in enumerate(loader):
        with torch.set_grad_enabled(train):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if train:
            opt.zero_grad()
            loss.backward()
            opt.step()
        step = "Train" if train else "Eval"
        print(f"[RANK{rank}] Epoch {epoch} | Iter {it} | {step} Loss {loss.item():.5f}")


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
    test = TensorDataset(torch.randn(39, 8), torch.randint(0, 2, (39,)))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=16, sampler=sampler)
    test_loader = DataLoader(test, batch_size=16, sampler=DistributedSampler(test, shuffle=False))
    model = DDP(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        run_epoch(model, loader, opt, epoch, train=True)
        run_epoch(model, test_loader, opt, epoch, train=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
