# expect: cannot judge
# args: 2 1
# first line: Nothing was launched: mp.spawn(main, nprocs=0) at {script}:54 started no process, so
#   no rank trained; torch.cuda.device_count() returned 0 on this machine just before (at
#   {script}:53)
"""pytorch/examples ddp-tutorial-series/multigpu.py, shortened: mp.spawn starts one process
per GPU, so on a CPU machine (device_count() == 0) it starts none and nothing trains."""

import argparse
import os

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    torch.cuda.set_device(rank)
    init_process_group(backend="nccl", rank=rank, world_size=world_size)


def main(rank, world_size, save_every, total_epochs, batch_size):
    ddp_setup(rank, world_size)
    dataset = TensorDataset(torch.randn(256, 20), torch.randint(0, 2, (256,)))
    loader = DataLoader(dataset, batch_size=batch_size, pin_memory=True, shuffle=False,
                        sampler=DistributedSampler(dataset))
    model = DDP(torch.nn.Linear(20, 2).to(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(total_epochs):
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(source.to(rank)), targets.to(rank)).backward()
            optimizer.step()
        if rank == 0 and epoch % save_every == 0:
            torch.save(model.module.state_dict(), "checkpoint.pt")
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size per device")
    args = parser.parse_args()

    world_size = torch.cuda.device_count()
    mp.spawn(main, args=(world_size, args.save_every, args.total_epochs, args.batch_size),
             nprocs=world_size)
