"""Probe: the pipeline schedules a rank made and the steps it ran (torch.distributed.pipelining).

Wraps the schedules' common constructor (`_PipelineSchedule.__init__`: micro-batches,
scale_grads, the loss function and its reduction) and `step()` of single- and multi-stage
schedules: this rank's stage, whether it is the last (the only one where the loss
function runs and `losses` fills), the batch size it was given, and how many losses the
`losses` list held when step() returned. Steps are noted for the first few and whenever
the batch size changes.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from course_lib.xray import record
from course_lib.xray.probes.data import first_tensor
from course_lib.xray.probes.patching import Patch, apply

MAX_STEPS = 4  # steps noted per schedule, besides those whose batch size changed
MAX_CHANGES = 4

_made = {"schedules": 0}


def patches() -> list[Patch]:
    """The schedules' common constructor, and step() of single- and multi-stage schedules."""
    from torch.distributed.pipelining import schedules

    return [Patch(schedules._PipelineSchedule, "__init__", _init),
            Patch(schedules.PipelineScheduleSingle, "step", _step),
            Patch(schedules.PipelineScheduleMulti, "step", _step)]


def install() -> None:
    apply(patches())


def _init(real: Any) -> Any:
    @functools.wraps(real)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        with record.guard():
            _made["schedules"] += 1
            record.tag(self, "key", _made["schedules"])
            loss, reduction = describe_loss(getattr(self, "_loss_fn", None))
            record.note("pipeline_schedule", key=_made["schedules"],
                        schedule=type(self).__name__,
                        n_microbatches=int(getattr(self, "_n_microbatches", 0)),
                        scale_grads=bool(getattr(self, "scale_grads", True)),
                        loss=loss, reduction=reduction)
    return init


def describe_loss(fn: Any) -> tuple[str, str]:
    """A loss function's name and, when it says, its reduction: an nn loss module's
    `reduction`, a functools.partial's `reduction=`, or the default of a function's own
    `reduction` parameter (F.mse_loss: "mean"); "" for a function without one."""
    if fn is None:
        return "", ""
    keywords: dict[str, Any] = {}
    while isinstance(fn, functools.partial):
        keywords = {**fn.keywords, **keywords}
        fn = fn.func
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if "reduction" in keywords:
        return name, str(keywords["reduction"])
    reduction = getattr(fn, "reduction", None)  # nn.MSELoss(), nn.CrossEntropyLoss()
    if isinstance(reduction, str):
        return type(fn).__name__, reduction
    try:
        default = inspect.signature(fn).parameters["reduction"].default
    except (KeyError, TypeError, ValueError):
        return name, ""
    return name, default if isinstance(default, str) else ""


def _step(real: Any) -> Any:
    @functools.wraps(real)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        event = None
        with record.guard():
            event = _note_step(self, args, kwargs)
        out = real(self, *args, **kwargs)
        losses = kwargs.get("losses")
        if event is not None and isinstance(losses, list):
            with record.guard():
                event["losses"] = len(losses)
        return out
    return step


def _note_step(schedule: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Note this step when it is one of the first or its batch size changed."""
    number = record.tagged(schedule, "steps", int) or 0
    record.tag(schedule, "steps", number + 1)
    batch = first_tensor(args)
    rows = int(batch.shape[0]) if batch is not None else -1
    sizes = record.tagged(schedule, "sizes", list) or []
    if number >= MAX_STEPS and (not sizes or rows == sizes[-1] or len(sizes) > MAX_CHANGES):
        return None
    record.tag(schedule, "sizes", [*sizes, rows])
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    return record.note("pipeline_step", schedule=record.tagged(schedule, "key", int) or 0,
                       number=number, stages=int(stages[0].num_stages),
                       stage=int(stages[0].stage_index),
                       last=any(bool(s.is_last) for s in stages), rows=rows,
                       losses_given=isinstance(kwargs.get("losses"), list))
