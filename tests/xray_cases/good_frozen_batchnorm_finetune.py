# expect: none
"""Fine-tuning with 4 images per rank: the pretrained backbone's BatchNorm layers are
frozen in eval mode (running statistics), only the new head trains."""
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten())
    for p in backbone.parameters():
        p.requires_grad_(False)
    model = nn.Sequential(backbone, nn.Linear(16, 5))
    ddp = DDP(model)
    optimizer = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        ddp.train()
        backbone.eval()  # keep the pretrained statistics
        x, y = torch.randn(4, 3, 16, 16, generator=gen), torch.randint(0, 5, (4,), generator=gen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
