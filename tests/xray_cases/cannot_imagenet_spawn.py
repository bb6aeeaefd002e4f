# expect: cannot judge
# args: --multiprocessing-distributed --world-size 1 --rank 0
# first line: Cannot x-ray it as it is: mp.spawn(main_worker, nprocs=1) at {script}:40 starts
#   processes of its own
"""pytorch/examples imagenet/main.py's launch, shortened: with --multiprocessing-distributed
it spawns one process per GPU itself (one on a CPU machine), which would meet on its own
--dist-url, once per x-ray rank."""

import argparse

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--world-size", default=-1, type=int)
parser.add_argument("--rank", default=-1, type=int)
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
parser.add_argument("--dist-backend", default="gloo", type=str)
parser.add_argument("--multiprocessing-distributed", action="store_true")


def main():
    args = parser.parse_args()
    args.distributed = args.world_size > 1 or args.multiprocessing_distributed
    use_accel = torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    print(f"Using device: {device}")
    ngpus_per_node = torch.accelerator.device_count() if device.type == "cuda" else 1
    if args.multiprocessing_distributed:
        # Since we have ngpus_per_node processes per node, the total world_size
        # needs to be adjusted accordingly
        args.world_size = ngpus_per_node * args.world_size
        # Use torch.multiprocessing.spawn to launch distributed processes: the
        # main_worker process function
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(None, ngpus_per_node, args)


def main_worker(gpu, ngpus_per_node, args):
    if args.distributed:
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    data = TensorDataset(torch.randn(256, 3, 8, 8), torch.randint(0, 10, (256,)))
    sampler = DistributedSampler(data)
    model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(192, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, target in DataLoader(data, batch_size=32, sampler=sampler):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(images), target).backward()
            optimizer.step()


if __name__ == "__main__":
    main()
