"""Probe: each optimizer step, with what happened since the last one.

A global optimizer step hook (torch.optim.optimizer.register_optimizer_step_*_hook) notes
one "opt_step" event per step: the DDP backward counts since the previous step (ddp probe),
and at sampled steps per-parameter checksums of the gradients (before the step) and of the
parameters (before the first step and after each sampled one), so that the detectors can
compare the ranks' replicas; while fp16 autocast trains, the fraction of gradient values that are
exactly zero. A GradScaler step that skips the optimizer step is noted as skipped (amp probe).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from course_lib.xray import record
from course_lib.xray.probes import ddp
from course_lib.xray.probes.patching import Patch

FIRST_SAMPLED = 10  # steps 1..10 are sampled, then every SAMPLE_EVERY-th
SAMPLE_EVERY = 50
MAX_EVENTS = 2000  # per optimizer

_local = threading.local()  # depth of an enclosing ZeroRedundancyOptimizer step
_amp = {"fp16_training": False}  # set by the amp probe
_made = {"optimizers": 0}


def patches() -> list[Patch]:
    """None: the probe registers torch's global optimizer step hooks instead (install)."""
    return []


def install() -> None:
    """Register the global step hooks, both or neither (a probe's own failure never stops
    the learner's run)."""
    before = register_optimizer_step_pre_hook(_quiet(_pre_step))
    try:
        register_optimizer_step_post_hook(_quiet(_post_step))
    except BaseException:
        before.remove()
        raise


def _quiet(hook: Any) -> Any:
    def run(*args: Any) -> None:
        with record.guard():  # an odd parameter must not break the training step
            hook(*args)
    return run


def sampled(step: int) -> bool:
    return step <= FIRST_SAMPLED or step % SAMPLE_EVERY == 0


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _comparable(params: list[torch.Tensor]) -> bool:
    """Replicas can be compared across ranks: plain tensors, not shards (DTensor, FSDP)."""
    return all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in params)


def checksum(tensors: Sequence[torch.Tensor | None]) -> list[list[float]]:
    """Per tensor, its sum and sum of squares in float64 ([0, 0] for a missing gradient):
    equal on ranks whose tensors hold equal values."""
    out = []
    with torch.no_grad():
        for t in tensors:
            if t is None or t.is_sparse or t.is_complex():
                out.append([0.0, 0.0])
                continue
            d = t.detach().to(torch.float64)
            out.append([float(d.sum()), float((d * d).sum())])
    return out


def zeros(grads: list[torch.Tensor]) -> tuple[int, int, float]:
    """How many gradient values are exactly 0.0, of how many, and the largest |value|."""
    zero = count = 0
    biggest = 0.0
    with torch.no_grad():
        for g in grads:
            if g.is_sparse or g.numel() == 0:
                continue
            zero += int((g == 0).sum())
            count += g.numel()
            biggest = max(biggest, float(g.abs().max()))
    return zero, count, biggest


def _is_zero(optimizer: Any) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def _pre_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if _is_zero(optimizer):
        _local.depth = getattr(_local, "depth", 0) + 1
    if getattr(_local, "depth", 0) and not _is_zero(optimizer):
        return  # ZeRO's inner optimizer steps one shard: the outer step is the one noted
    step = (record.tagged(optimizer, "steps", int) or 0) + 1
    pending: dict[str, Any] = {}
    record.tag(optimizer, "steps", step)
    record.tag(optimizer, "pending", pending)
    if step > MAX_EVENTS or not sampled(step):
        return
    params = _params(optimizer)
    grads = [p.grad for p in params if p.grad is not None]
    if _comparable(params):
        if step == 1:
            pending["params_before"] = checksum(params)
        pending["grads"] = checksum([p.grad for p in params])
        pending["shapes"] = _shape_key(params)
    if not _amp["fp16_training"] and any(p.dtype == torch.float16 for p in params):
        _amp["fp16_training"] = True  # model.half(): fp16 weights and gradients
        record.note("fp16_params", record.where(2), count=len(params))
    if _amp["fp16_training"] and grads:
        pending["zero"], pending["values"], pending["max_abs"] = zeros(grads)


def _shape_key(params: list[torch.Tensor]) -> str:
    return str(hash(tuple(tuple(p.shape) for p in params)))


def _post_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if _is_zero(optimizer):
        _local.depth = max(0, getattr(_local, "depth", 1) - 1)
    elif getattr(_local, "depth", 0):
        return
    step = record.tagged(optimizer, "steps", int) or 0
    pending = record.tagged(optimizer, "pending", dict) or {}
    counts = ddp.take_counts(_params(optimizer))
    if step > MAX_EVENTS:
        return
    event = {"step": step, "opt": _optimizer_key(optimizer), **counts, **pending}
    if "grads" in pending:
        event["params"] = checksum(_params(optimizer))
    record.note("opt_step", record.where(2), **event)


def skipped_step(optimizer: torch.optim.Optimizer) -> None:
    """A GradScaler step that found inf/NaN and skipped optimizer.step()."""
    counts = ddp.take_counts(_params(optimizer))
    record.note("opt_step", record.where(2), step=record.tagged(optimizer, "steps", int) or 0,
                opt=_optimizer_key(optimizer), skipped=True, **counts)


def _optimizer_key(optimizer: torch.optim.Optimizer) -> str:
    """A name for the optimizer, the same on every rank that makes them in the same order."""
    key = record.tagged(optimizer, "key", str)
    if key is None:
        _made["optimizers"] += 1
        key = f"{type(optimizer).__name__}#{_made['optimizers']}"
        record.tag(optimizer, "key", key)
    return key
