# expect: P18
"""shuffle=True passed together with a DistributedSampler: DataLoader refuses."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, shuffle=True, sampler=DistributedSampler(data))
    for _batch in loader:
        pass


if __name__ == "__main__":
    main()
