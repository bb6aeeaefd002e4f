"""Lesson 17's measurements of a pipeline, on the ranks and from their telemetry: a stage
that takes a steady time (so that the schedule, not a loaded laptop, draws the timeline),
each micro-batch's forward and backward recorded as spans, the bytes of activations a stage
keeps for backward, and the bubble measured against (p - 1) / (m + p - 1)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from course_lib.telemetry import Recorder, Table, Telemetry


class _WaitInBackward(torch.autograd.Function):
    """Identity in forward; in backward, waits until `seconds` have passed since the
    backward reached it, so a stage's backward takes a steady time too."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class Paced(nn.Module):
    """`module`, padded so that its forward takes at least `forward_ms` and its backward
    at least `backward_ms`: a GPU stage's steady time, on a CPU shared with other work."""

    def __init__(self, module: nn.Module, forward_ms: float = 20, backward_ms: float = 40):
        super().__init__()
        self.module, self.forward_s, self.backward_s = module, forward_ms / 1e3, backward_ms / 1e3

    def forward(self, *args: Any) -> Any:
        start = time.perf_counter()
        out = self.module(*args)
        time.sleep(max(0.0, self.forward_s - (time.perf_counter() - start)))
        return _WaitInBackward.apply(out, self.backward_s) if torch.is_grad_enabled() else out


def record_chunks(stage: Any, rec: Recorder) -> None:
    """Record every forward and backward of one micro-batch that `stage` (a torch
    PipelineStage) runs as a span "F<i>" or "B<i>": its compute, not its waits (the
    schedule receives before it calls these and sends after)."""
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

    def timed_forward(chunk: int, *args: Any, **kwargs: Any) -> Any:
        with rec.span(f"F{chunk}"):
            return forward(chunk, *args, **kwargs)

    def timed_backward(chunk: int, *args: Any, **kwargs: Any) -> Any:
        with rec.span(f"B{chunk}"):
            return backward(chunk, *args, **kwargs)

    stage.forward_one_chunk, stage.backward_one_chunk = timed_forward, timed_backward


class SavedActivations:
    """Counts the bytes autograd keeps for backward while the block runs (saved-tensor
    hooks): the activations. `peak` is the most held at once. Parameters are left out, and
    a tensor saved twice (one layer's output is the next one's input) counts once."""

    def __init__(self, model: nn.Module) -> None:
        self.params = {p.data_ptr() for p in model.parameters()}
        self.held: dict[tuple, list[int]] = {}  # tensor -> [references, bytes]
        self.now = self.peak = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> Any:
        if t.data_ptr() in self.params:
            return t
        key = (t.data_ptr(), tuple(t.shape), t.dtype)
        entry = self.held.setdefault(key, [0, t.numel() * t.element_size()])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
        entry[0] += 1
        return _Held(t, self, key)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def release(self, key: tuple) -> None:
        entry = self.held[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.held[key]

    def __enter__(self) -> SavedActivations:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)


class _Held:
    """A saved tensor; autograd drops it once the backward that needed it has run."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: torch.Tensor, meter: SavedActivations, key: tuple) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter.release(self.key)


# -- reading the spans, in the kernel --------------------------------------------------------

def chunk_spans(tel: Telemetry, step: int) -> Table:
    """The F<i> and B<i> spans of one training step, every rank."""
    spans = tel.spans.where(step=step)
    keep = np.array([n[:1] in "FB" and n[1:].isdigit() for n in spans["name"]], dtype=bool)
    return Table({c: spans[c][keep] for c in spans.columns})


def theory_bubble(stages: int, microbatches: int) -> float:
    """The idle share of a pipeline with equal stages: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def bubble(tel: Telemetry, step: int) -> float:
    """The measured idle share of one step: 1 - (time all ranks computed) / (ranks x the
    step's span, from the first forward anywhere to the last backward anywhere)."""
    spans = chunk_spans(tel, step)
    window = float(spans["end"].max() - spans["start"].min())
    busy = float((spans["end"] - spans["start"]).sum())
    return 1 - busy / (len(tel.ranks) * window)


def in_flight(tel: Telemetry, step: int, rank: int) -> int:
    """The most micro-batches whose forward had run on `rank` and whose backward had not:
    the micro-batches whose activations the stage held at once."""
    spans = chunk_spans(tel, step).where(rank=rank)
    events = sorted((end, 1 if name[0] == "F" else -1)
                    for name, end in zip(spans["name"], spans["end"]))
    held = peak = 0
    for _, change in events:
        held += change
        peak = max(peak, held)
    return peak
