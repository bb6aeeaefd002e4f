"""Probe: mixed precision: autocast's dtype when it trains, and whether a GradScaler scales.

Wraps autocast's __enter__ (noted once per device and dtype, with whether gradients were
enabled: training or only evaluation), GradScaler.scale (its first use by each enabled
scaler) and GradScaler.step (a step it skipped for inf/NaN gradients goes to the optimizer
probe).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.amp import GradScaler
from torch.amp.autocast_mode import autocast

from course_lib.xray import record
from course_lib.xray.probes import optim
from course_lib.xray.probes.patching import Patch, apply

_seen: set[tuple[str, str, bool]] = set()


def patches() -> list[Patch]:
    """autocast.__enter__ and GradScaler's scale() and step()."""
    return [Patch(autocast, "__enter__", _enter), Patch(GradScaler, "scale", _scale),
            Patch(GradScaler, "step", _step)]


def install() -> None:
    apply(patches())


def _enter(real: Any) -> Any:
    @functools.wraps(real)
    def enter(self: autocast) -> Any:
        with record.guard():
            _note_autocast(self)
        return real(self)
    return enter


def _note_autocast(self: autocast) -> None:
    """Note each (device, dtype, training) autocast once; fp16 training for the optimizer
    probe, which then counts the gradients' zeros."""
    enabled = bool(getattr(self, "_enabled", False))
    dtype = str(getattr(self, "fast_dtype", "")).replace("torch.", "")
    training = torch.is_grad_enabled()
    key = (str(getattr(self, "device", "")), dtype, training)
    if enabled and key not in _seen:
        _seen.add(key)
        record.note("autocast", device=key[0], dtype=dtype, training=training)
    if enabled and training and dtype == "float16":
        optim._amp["fp16_training"] = True


def _scale(real: Any) -> Any:
    @functools.wraps(real)
    def scale(self: GradScaler, outputs: Any) -> Any:
        with record.guard():
            if self._enabled and not record.tagged(self, "scaled", bool):
                record.tag(self, "scaled", True)
                record.note("scaler_scale")
        return real(self, outputs)
    return scale


def _step(real: Any) -> Any:
    @functools.wraps(real)
    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any,
             **kwargs: Any) -> Any:
        before = record.tagged(optimizer, "steps", int) or 0
        out = real(self, optimizer, *args, **kwargs)
        with record.guard():
            if (record.tagged(optimizer, "steps", int) or 0) == before:
                optim.skipped_step(optimizer)
        return out
    return step
