"""A SyncBatchNorm that works on the CPU (gloo), for learning what torch's does on GPUs.

torch's `nn.SyncBatchNorm` refuses CPU tensors. This one computes the same thing with plain
collectives: in a training forward every rank all-reduces, per channel, the sum and the sum
of squares of its inputs together with its sample count, so every rank normalises with the
mean and (biased) variance of the global batch, all ranks' samples together. The backward
all-reduces the two sums the input gradient needs. Running statistics are updated with the
global mean and the unbiased global variance, as BatchNorm does on one process.

    model = SyncBatchNorm.convert_sync_batchnorm(model)   # every BatchNorm*d layer replaced
    ddp_model = DDP(model)

Weight and bias gradients stay per rank, as in torch's SyncBatchNorm: DDP's all-reduce
averages them with every other gradient. In eval mode (or without a process group, or with
one rank) it behaves exactly like BatchNorm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

# The statistics are summed in float64: a sum of squares in float32 loses the variance
# when the mean is large compared with the spread.
STATS_DTYPE = torch.float64


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training-mode statistics are those of the global batch (all ranks).

    Same arguments as nn.SyncBatchNorm; inputs are (N, C) or (N, C, ...) on any device.
    Every rank of `process_group` (default: all ranks) must run the forward and backward
    together, as with any collective.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training and _world_size(self.process_group) > 1):
            return super().forward(input)  # BatchNorm: eval mode, or nothing to sync with
        factor = self._momentum_factor()
        track = self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if track else None, self.running_var if track else None,
            self.eps, factor, self.process_group)

    def _momentum_factor(self) -> float:
        """The running-statistics update factor of this step (and count the step), as
        BatchNorm does: momentum, or 1/steps for a cumulative average (momentum=None)."""
        if not self.track_running_stats:
            return 0.0
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Any = None) -> nn.Module:
        """Replace every BatchNorm*d layer in `module` by this SyncBatchNorm, keeping its
        parameters and running statistics (the same objects); returns the converted module."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
            if module.affine:
                converted.weight, converted.bias = module.weight, module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted


def _world_size(group: Any) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _channel_view(t: torch.Tensor, dims: int) -> torch.Tensor:
    """A per-channel tensor (C,) shaped to broadcast against an (N, C, ...) input."""
    return t.view(1, -1, *([1] * (dims - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Forward: global statistics by one all-reduce of [sum, sum of squares, count].
    Backward: one all-reduce of [sum of grad, sum of grad * (x - mean)]."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None,
                running_var: torch.Tensor | None, eps: float, factor: float,
                group: Any) -> torch.Tensor:
        channels = input.size(1)
        reduce_dims = [d for d in range(input.dim()) if d != 1]
        x = input.to(STATS_DTYPE)
        count = input.numel() // channels if channels else 0
        stats = torch.cat([x.sum(reduce_dims), (x * x).sum(reduce_dims),
                           torch.tensor([float(count)], dtype=STATS_DTYPE,
                                        device=input.device)])
        dist.all_reduce(stats, group=group)
        total = stats[-1].item()
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{int(total)} over all ranks")
        mean = stats[:channels] / total
        var = (stats[channels:2 * channels] / total - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * (total / (total - 1))
                running_mean.mul_(1 - factor).add_(factor * mean.to(running_mean.dtype))
                running_var.mul_(1 - factor).add_(factor * unbiased.to(running_var.dtype))

        dims = input.dim()
        mean_, invstd_ = (_channel_view(t.to(input.dtype), dims) for t in (mean, invstd))
        normalised = (input - mean_) * invstd_
        out = normalised
        if weight is not None:
            out = out * _channel_view(weight, dims)
        if bias is not None:
            out = out + _channel_view(bias, dims)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total, ctx.group = total, group
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        input, weight, mean, invstd = ctx.saved_tensors
        channels, dims = input.size(1), input.dim()
        reduce_dims = [d for d in range(dims) if d != 1]
        g = grad_output.to(STATS_DTYPE)
        centred = input.to(STATS_DTYPE) - _channel_view(mean, dims)
        sum_dy = g.sum(reduce_dims)
        sum_dy_xmu = (g * centred).sum(reduce_dims)

        # This rank's part of dL/dweight and dL/dbias; DDP all-reduces them with the rest.
        grad_weight = (sum_dy_xmu * invstd).to(input.dtype) if weight is not None else None
        grad_bias = sum_dy.to(input.dtype) if ctx.has_bias else None

        grad_input = None
        if ctx.needs_input_grad[0]:
            # Every sample moved the global mean and variance: the input gradient needs the
            # sums over the global batch.
            both = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(both, group=ctx.group)
            mean_dy = both[:channels] / ctx.total
            mean_dy_xmu = both[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(STATS_DTYPE)
            grad_input = ((g - _channel_view(mean_dy, dims)
                           - centred * _channel_view(mean_dy_xmu * invstd * invstd, dims))
                          * _channel_view(scale, dims)).to(input.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None



def plot_normalisation(shares: list[tuple[torch.Tensor, torch.Tensor]], title: str = ""):
    """What each rank's BatchNorm did with its share of one global batch.

    `shares`: per rank, (its input rows, the layer's output for them), in rank order, from a
    layer with weight 1 and bias 0 (a fresh one). Left: per channel, the mean of each rank's
    rows next to the mean of the whole batch (what plain BatchNorm on a rank normalises with,
    against what one process would use). Right: each rank's output against BatchNorm's
    output on the whole batch, for the same rows: on the diagonal = the same normalisation.
    """
    import numpy as np

    from course_lib.plots.style import BLACK, new_figure, rank_bar_style, rank_style

    inputs = torch.cat([x for x, _ in shares]).float()
    reference = nn.functional.batch_norm(inputs, None, None, training=True)
    channels = np.arange(inputs.shape[1])
    fig = new_figure(11, 4.2)
    stats_ax, out_ax = fig.subplots(1, 2)
    width = 0.8 / (len(shares) + 1)
    start = 0
    for rank, (x, out) in enumerate(shares):
        offset = (rank - len(shares) / 2) * width
        stats_ax.bar(channels + offset, x.float().mean(0).numpy(), width,
                     label=f"rank {rank}'s rows", **rank_bar_style(rank))
        rows = reference[start:start + len(x)]
        start += len(x)
        style = rank_style(rank)
        out_ax.plot(rows.flatten().numpy(), out.float().flatten().numpy(), linestyle="none",
                    marker=style["marker"], color=style["color"], ms=7, alpha=0.8,
                    label=f"rank {rank}")
    stats_ax.bar(channels + (len(shares) / 2) * width, inputs.mean(0).numpy(), width,
                 label="whole batch", color="#DDDDDD", hatch="xx", edgecolor=BLACK)
    stats_ax.axhline(0, color=BLACK, lw=0.5)
    stats_ax.set_xticks(channels, [f"channel {c}" for c in channels])
    stats_ax.set_ylabel("mean of the input")
    stats_ax.set_title("Batch means per channel: each rank's rows vs the whole batch")
    stats_ax.legend(fontsize="small")
    low, high = float(reference.min()) - 0.5, float(reference.max()) + 0.5
    out_ax.plot([low, high], [low, high], color=BLACK, lw=1, ls=":", label="same as one process")
    out_ax.set_xlabel("BatchNorm on the whole batch (one process)")
    out_ax.set_ylabel("what this rank's layer output")
    out_ax.set_title("Normalised values: rank vs one process on the whole batch")
    out_ax.legend(fontsize="small")
    fig.suptitle(title or "BatchNorm under DDP: what each rank normalised with")
    return fig
