"""Record BatchNorm layers: each training forward's batch statistics and running buffers."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course_lib.telemetry.host import RecordHost
from course_lib.wrappers import unwrap

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def watch(rec: RecordHost, model: nn.Module) -> None:
    """Hook every BatchNorm layer of `model` so that it records into `rec`."""
    layers = [(n, m) for n, m in unwrap(model).named_modules() if isinstance(m, BATCHNORMS)]
    if not layers:
        raise ValueError("watch_batchnorm(): the model has no BatchNorm layer")
    for name, module in layers:
        layer = _Layer(rec, name)
        module.register_forward_pre_hook(layer.before)
        module.register_forward_hook(layer.after)


class _Layer:
    """Records one layer, one row per training forward: the batch statistics of this rank's
    input (biased variance, as used to normalise) and the running buffers the layer started
    the forward with (after DDP's buffer broadcast; NaN without running statistics)."""

    def __init__(self, rec: RecordHost, name: str) -> None:
        self.rec, self.name, self.running = rec, name, None

    def before(self, module: nn.Module, inputs: tuple) -> None:
        if module.training:
            self.running = [b.detach().clone() if b is not None else None
                            for b in (module.running_mean, module.running_var)]

    def after(self, module: nn.Module, inputs: tuple, output: Any) -> None:
        if not module.training:
            return
        mean, var = _batch_statistics(inputs[0].detach(), output, module.eps)
        running = [torch.full_like(mean, float("nan")) if b is None else b for b in self.running]
        # one stacked copy per record: many small retained tensors would slow later steps
        stats = torch.stack([mean, var, *running])
        self.rec.record_row("batchnorm", self.rec.current_step, self.name, *stats)


def _batch_statistics(x: torch.Tensor, output: Any, eps: float) -> tuple[torch.Tensor, ...]:
    """Per-channel mean and biased variance of the batch. When autograd kept the ones the
    layer computed (its saved mean and 1/sqrt(var + eps)) they cost nothing; otherwise they
    are computed as E[x^2] - E[x]^2 in float64 (faster than torch.var_mean on a CPU)."""
    node = getattr(output, "grad_fn", None)
    if type(node).__name__ == "NativeBatchNormBackward0":
        return node._saved_result1.detach(), node._saved_result2.detach().pow(-2) - eps
    x = x.double()
    dims = [d for d in range(x.dim()) if d != 1]
    mean = x.mean(dims)
    return mean.float(), ((x * x).mean(dims) - mean * mean).float()
