# expect: cannot judge
# first line: Cannot run here: {script}:19 `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`
#   needs a GPU
"""pytorch/examples ddp-tutorial-series/multigpu_torchrun.py, shortened: a GPU per rank,
chosen with torch.cuda.set_device before the NCCL group (on a CPU-only torch:
AttributeError: module 'torch._C' has no attribute '_cuda_setDevice')."""

import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model.to(self.gpu_id), device_ids=[self.gpu_id])
        self.train_data = train_data
        self.optimizer = optimizer

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self.train_data.sampler.set_epoch(epoch)
            for source, targets in self.train_data:
                source, targets = source.to(self.gpu_id), targets.to(self.gpu_id)
                self.optimizer.zero_grad()
                F.cross_entropy(self.model(source), targets).backward()
                self.optimizer.step()


def main(total_epochs=2, batch_size=32):
    ddp_setup()
    dataset = TensorDataset(torch.randn(256, 20), torch.randint(0, 2, (256,)))
    model = torch.nn.Linear(20, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False,
                        sampler=DistributedSampler(dataset))
    Trainer(model, loader, optimizer).train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()
