"""Gradient summaries: each parameter's gradient norm and first few values, from a flat buffer.

DDP's buckets hold their parameters' gradients back to back in one flat tensor; an explicit
call concatenates a model's gradients the same way. Views of the buffer give the norms,
one gather gives the first values, and nothing leaves the device until collection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from course_lib.telemetry.columns import COLUMNS


@dataclass(frozen=True)
class Layout:
    """Where each parameter's gradient sits in a flat buffer."""

    names: tuple[str, ...]
    indices: tuple[int, ...]  # each parameter's position in model.named_parameters()
    numels: tuple[int, ...]  # each parameter's number of elements, in buffer order
    picks: torch.Tensor  # (parameters, k): buffer positions of each one's first k values


@dataclass(frozen=True)
class GradRecord:
    """One snapshot of some parameters' gradients (a DDP bucket, or a whole model)."""

    step: int
    when: str
    bucket: int
    layout: Layout
    summary: torch.Tensor  # (parameters, 1 + k): each one's norm, then its first k values


def parameter_names(module: nn.Module) -> dict[int, tuple[int, str]]:
    """id(parameter) -> (position, name) in module.named_parameters()."""
    return {id(p): (i, name) for i, (name, p) in enumerate(module.named_parameters())}


def make_layout(params: list[torch.Tensor], names: dict[int, tuple[int, str]], k: int) -> Layout:
    """The layout of these parameters' gradients concatenated in this order."""
    numels = torch.tensor([p.numel() for p in params])
    starts = torch.cumsum(numels, 0) - numels
    firsts = torch.arange(k)
    picks = torch.minimum(starts[:, None] + firsts, (starts + numels - 1)[:, None])
    device = params[0].device
    return Layout(
        names=tuple(names[id(p)][1] for p in params),
        indices=tuple(names[id(p)][0] for p in params),
        numels=tuple(numels.tolist()),
        picks=picks.to(device),
    )


def summarise(step: int, when: str, bucket: int, flat: torch.Tensor, layout: Layout) -> GradRecord:
    """Norms and first values of each parameter's gradient in the flat buffer (copies)."""
    flat = flat.detach()
    norms = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32)
                         for g in flat.split(layout.numels)])
    values = flat[layout.picks].float()  # a parameter with fewer than k values repeats its last
    # one tensor per record: many small retained tensors would slow every later step
    return GradRecord(step, when, bucket, layout, torch.cat([norms[:, None], values], dim=1))


def grad_rows(records: list[GradRecord]) -> dict[str, list]:
    """One row per parameter per snapshot."""
    cols: dict[str, list] = {c: [] for c in COLUMNS["grads"]}
    for r in records:
        n = len(r.layout.names)
        cols["step"] += [r.step] * n
        cols["when"] += [r.when] * n
        cols["bucket"] += [r.bucket] * n
        cols["param"] += r.layout.names
        cols["index"] += r.layout.indices
        summary = r.summary.tolist()
        cols["norm"] += [row[0] for row in summary]
        cols["values"] += [row[1:n + 1] for row, n in zip(summary, r.layout.numels)]
    return cols
