"""Which device a rank should use, the same way under the launcher and under torchrun."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def rank_device() -> torch.device:
    """cuda:LOCAL_RANK when the process group uses NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")
