"""The model inside a parallel wrapper: one helper for telemetry and the teaching tools."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel or DataParallel wrapper, else the model."""
    wrappers = (nn.parallel.DistributedDataParallel, nn.DataParallel)
    return model.module if isinstance(model, wrappers) else model
