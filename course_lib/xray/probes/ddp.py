"""Probe: what DistributedDataParallel did in each backward, and how BatchNorm normalised.

Wraps DDP's constructor (its options, the model's BatchNorm layers, a gradient hook on each
parameter) and its forward (whether the backward after it will all-reduce: grad enabled and
not inside no_sync()). A backward is counted when a parameter got a gradient after that
forward; the optimizer probe takes the counts at each step (take_counts). Also wraps plain
BatchNorm's forward (SyncBatchNorm has its own) to record the per-rank training batch size.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply

MAX_NAMES = 4  # unused parameters named in an event

_live: list[weakref.ref[Any]] = []  # the run's DDP objects
_progress = {"forwards": 0, "backwards": 0}  # synced ones over the run, every DDP model


class _Tracker:
    """One DDP model's backward accounting: since the last optimizer step of its parameters,
    and since their last zero_grad() (the backwards whose gradients one step applies)."""

    def __init__(self, ddp: DDP) -> None:
        named = [(n, p) for n, p in ddp.module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.ids = {id(p) for _, p in named}
        self.params = [weakref.ref(p) for _, p in named]
        self.probe: weakref.ref[Any] | None = None  # a small parameter that gets gradients
        self.seen: set[int] = set()  # parameters that got a gradient since the last forward
        self.pending: bool | None = None  # the last forward's sync flag, None: no forward
        self.synced = self.local = self.all_used = self.no_sync = 0
        self.accumulated = 0  # synced backwards since the last zero_grad()
        self.nonzero_seen = False  # the probe parameter has had a non-zero gradient
        self.unused_noted = False
        self.forward_at = ""  # the learner's line of the first synced forward since the step

    def settle(self, keep_waiting: bool = False) -> None:
        """Count the backward (if any) that followed the last forward; with keep_waiting, a
        forward whose backward has not run yet stays pending."""
        if self.pending is None or not self.seen:
            if not keep_waiting:
                self.pending, self.seen = None, set()
            return
        if self.probe is None:
            index = min(self.seen, key=lambda i: _numel(self.params[i]))
            self.probe = self.params[index]
        if self.pending:
            self.synced += 1
            self.accumulated += 1
            _progress["backwards"] += 1
            if len(self.seen) == len(self.names):
                self.all_used += 1
            elif not self.unused_noted:
                self.unused_noted = True
                unused = [n for i, n in enumerate(self.names) if i not in self.seen]
                record.note("ddp_unused", "", names=unused[:MAX_NAMES],
                            count=len(unused), of=len(self.names))
        else:
            self.local += 1
        self.pending, self.seen = None, set()


    def restart_if_cleared(self) -> None:
        """A new accumulation when the gradients were cleared without zero_grad()
        (`p.grad = None`, or zeroed in place): the probe parameter has no gradient, or a
        zero one after it had a non-zero one (a model whose gradients are all zero, e.g.
        cross-entropy over one output, is not cleared by its own backward)."""
        probe = self.probe() if self.probe is not None else None
        if probe is None:
            return
        grad = probe.grad
        nonzero = grad is not None and bool(grad.any())
        if grad is None or (not nonzero and self.nonzero_seen):
            self.accumulated = 0
        self.nonzero_seen = self.nonzero_seen or nonzero


def _numel(ref: weakref.ref[Any]) -> int:
    p = ref()
    return p.numel() if p is not None else 1 << 62


def patches() -> list[Patch]:
    """DDP's constructor, forward and no_sync, plain BatchNorm's forward, and zero_grad
    (optimizer and module), which starts a new accumulation."""
    return [Patch(DDP, "__init__", _ddp_init), Patch(DDP, "forward", _ddp_forward),
            Patch(DDP, "no_sync", _no_sync), Patch(_BatchNorm, "forward", _bn_forward),
            Patch(torch.optim.Optimizer, "zero_grad", functools.partial(
                _zero_grad, params_of=_optimizer_params)),
            Patch(nn.Module, "zero_grad", functools.partial(
                _zero_grad, params_of=_module_params))]


def install() -> None:
    apply(patches())


def _optimizer_params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in opt.param_groups for p in group["params"]]


def _module_params(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters())


def progress() -> tuple[int, int]:
    """Synced DDP forwards begun and synced backwards run so far in this rank: a rank's
    k-th synced backward ends only after every rank began its k-th (the all-reduce)."""
    running = 0
    for ref in _live:
        tracker = record.tagged(ref(), "tracker", _Tracker)
        running += bool(tracker is not None and tracker.pending and tracker.seen)
    return _progress["forwards"], _progress["backwards"] + running


def _trackers(params: list[torch.Tensor]) -> list[_Tracker]:
    """The trackers of the DDP models that own any of these parameters."""
    ids = {id(p) for p in params}
    found = []
    for ref in list(_live):
        tracker = record.tagged(ref(), "tracker", _Tracker)
        if tracker is not None and not tracker.ids.isdisjoint(ids):
            found.append(tracker)
    return found


def take_counts(params: list[torch.Tensor]) -> dict[str, Any]:
    """For the DDP models owning these (an optimizer's) parameters, since the last call:
    backwards all-reduced ('synced'), inside no_sync() ('local'), synced with every
    parameter used ('all_used'), no_sync() entries ('no_sync'), the line of the first synced
    forward ('forward_at'), and the synced backwards since zero_grad() ('accumulated')."""
    total: dict[str, Any] = {"synced": 0, "local": 0, "all_used": 0, "no_sync": 0,
                             "accumulated": 0}
    at = ""
    for tracker in _trackers(params):
        tracker.settle(keep_waiting=True)
        for key in ("synced", "local", "all_used", "no_sync"):
            total[key] += getattr(tracker, key)
        total["accumulated"] = max(total["accumulated"], tracker.accumulated)
        at = at or tracker.forward_at
        tracker.synced = tracker.local = tracker.all_used = tracker.no_sync = 0
        tracker.forward_at = ""
    if at:
        total["forward_at"] = at
    return total


def _zero_grad(real: Any, params_of: Any) -> Any:
    @functools.wraps(real)
    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        with record.guard():
            for tracker in _trackers(params_of(self)) if _live else []:
                tracker.settle(keep_waiting=True)
                tracker.accumulated = 0
        return real(self, *args, **kwargs)
    return zero_grad


def _ddp_init(real: Any) -> Any:
    @functools.wraps(real)
    def init(self: DDP, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        where = record.where(2)
        real(self, module, *args, **kwargs)
        with record.guard():
            _watch(self, where)
    return init


def _watch(ddp: DDP, where: str) -> None:
    """Hook the new DDP model's parameters and note its options and BatchNorm layers."""
    tracker = _Tracker(ddp)
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    for index, p in enumerate(params):
        p.register_post_accumulate_grad_hook(_seen_hook(tracker, index))
    record.tag(ddp, "tracker", tracker)
    _live.append(weakref.ref(ddp))
    bns, sync_bns = _batchnorms(ddp.module)
    record.note("ddp", where, find_unused=bool(ddp.find_unused_parameters),
                static_graph=bool(getattr(ddp, "static_graph", False)),
                params=len(params), batchnorm=bns, sync_batchnorm=sync_bns)


def _seen_hook(tracker: _Tracker, index: int) -> Any:
    def hook(_: torch.Tensor) -> None:
        tracker.seen.add(index)
    return hook


def _batchnorms(model: nn.Module) -> tuple[list[str], list[str]]:
    """The names of the model's plain BatchNorm layers and of its SyncBatchNorm layers;
    each plain one is labelled with its name for the BatchNorm events."""
    plain, synced = [], []
    for name, layer in model.named_modules():
        if isinstance(layer, nn.SyncBatchNorm):
            synced.append(name)
        elif isinstance(layer, _BatchNorm):
            plain.append(name)
            record.tag(layer, "name", name)
    return plain, synced


def _ddp_forward(real: Any) -> Any:
    @functools.wraps(real)
    def forward(self: DDP, *args: Any, **kwargs: Any) -> Any:
        tracker = record.tagged(self, "tracker", _Tracker)
        if tracker is not None:
            with record.guard():
                _before_forward(self, tracker)
        return real(self, *args, **kwargs)
    return forward


def _before_forward(ddp: DDP, tracker: _Tracker) -> None:
    """Close the last forward's accounting; note whether this one's backward will sync."""
    tracker.settle()
    tracker.restart_if_cleared()
    if torch.is_grad_enabled():
        tracker.pending = bool(ddp.require_backward_grad_sync)
        _progress["forwards"] += tracker.pending
        if tracker.pending and not tracker.forward_at:
            tracker.forward_at = record.where(3)


def _no_sync(real: Any) -> Any:
    @functools.wraps(real)
    def no_sync(self: DDP) -> Any:
        tracker = record.tagged(self, "tracker", _Tracker)
        if tracker is not None:
            tracker.no_sync += 1
        return real(self)
    return no_sync


def _bn_forward(real: Any) -> Any:
    @functools.wraps(real)
    def forward(self: _BatchNorm, input: torch.Tensor) -> Any:
        with record.guard():
            _note_batchnorm(self, input)
        return real(self, input)
    return forward


def _note_batchnorm(self: _BatchNorm, input: torch.Tensor) -> None:
    """Note a training BatchNorm layer's largest batch so far."""
    if self.training and torch.is_grad_enabled() and input.dim() >= 2:
        batch = int(input.shape[0])
        if batch > (record.tagged(self, "batch", int) or 0):
            record.tag(self, "batch", batch)
            record.note("batchnorm", layer=record.tagged(self, "name", str) or "",
                        cls=type(self).__name__, batch=batch, layer_id=id(self))
