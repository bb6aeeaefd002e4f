"""Probe: mixed precision: autocast's dtype when it trains, and whether a GradScaler scales.

Wraps autocast's __enter__ (noted once per device and dtype, with whether gradients were
enabled: training or only evaluation), GradScaler's constructor and scale() (its first use),
and GradScaler.step (a step it skipped for inf/NaN gradients goes to the optimizer probe).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.amp import GradScaler
from torch.amp.autocast_mode import autocast

from course_lib.xray import record
from course_lib.xray.probes import optim

_seen: set[tuple[str, str, bool]] = set()


def install() -> None:
    """Patch autocast.__enter__ and GradScaler's scale() and step()."""
    autocast.__enter__ = _enter(autocast.__enter__)
    GradScaler.scale = _scale(GradScaler.scale)
    GradScaler.step = _step(GradScaler.step)


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
            if self._enabled and not getattr(self, "_xray_scaled", False):
                self._xray_scaled = True
                record.note("scaler_scale")
        return real(self, outputs)
    return scale


def _step(real: Any) -> Any:
    @functools.wraps(real)
    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any,
             **kwargs: Any) -> Any:
        before = getattr(optimizer, "_xray_steps", 0)
        out = real(self, optimizer, *args, **kwargs)
        with record.guard():
            if getattr(optimizer, "_xray_steps", 0) == before:
                optim.skipped_step(optimizer)
        return out
    return step
