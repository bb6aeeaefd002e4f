# expect: none
"""A distributed checkpoint (torch.distributed.checkpoint): every rank saves and loads its
part collectively; the state dict helpers strip DDP's 'module.' prefix."""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def train(model, optimizer, steps):
    for _ in range(steps):
        x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def main():
    ckpt_dir = sys.argv[1] if len(sys.argv) > 1 else "dcp_checkpoint"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, optimizer, 3)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=ckpt_dir)

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=ckpt_dir)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    train(model, optimizer, 2)
    if int(os.environ["RANK"]) == 0:
        print("resumed and trained 2 more steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
