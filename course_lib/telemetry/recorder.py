"""Recorder: what one rank records while it trains."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib import devices
from course_lib.telemetry import batchnorm, comm, transport
from course_lib.telemetry.clock import now
from course_lib.telemetry.columns import COLUMNS
from course_lib.telemetry.grads import (
    GradRecord,
    Layout,
    grad_rows,
    make_layout,
    parameter_names,
    summarise,
)
from course_lib.telemetry.run_telemetry import Telemetry
from course_lib.telemetry.sampler import RecordedSampler
from course_lib.wrappers import unwrap

WHEN = ("before", "after")


class Recorder:
    """Records this rank's steps, spans, scalars, gradients, all-reduces, BatchNorm and samples.

    Under `launch` the records come back as `run.telemetry`; under torchrun set
    COURSE_TELEMETRY_DIR (or call save()) to get one file per rank. Recorder(enabled=False)
    records nothing and installs nothing.
    """

    def __init__(self, enabled: bool = True, raw_values: int = 4) -> None:
        self.enabled = enabled
        self.raw_values = raw_values  # first values of each gradient kept with its norm
        self.current_step = 0
        self.rank, self.world_size = _rank_and_world_size()
        self._rows: dict[str, list[tuple]] = {name: [] for name in COLUMNS if name != "grads"}
        self._grads: list[GradRecord] = []
        self._layouts: dict[tuple[int, ...], Layout] = {}
        if enabled:
            transport.track(self)

    # -- what a training loop calls -------------------------------------------------------

    def step(self, step: int) -> AbstractContextManager[None]:
        """Time the block as span "step"; everything recorded from here on is labelled `step`."""
        self.current_step = step
        return self.span("step")

    def span(self, name: str) -> AbstractContextManager[None]:
        """Time the block as a span called `name`, on a clock all ranks of a machine share
        (on a GPU, each edge first waits for the work queued before it)."""
        return _Span(self, name) if self.enabled else nullcontext()

    def scalar(self, name: str, value: float | torch.Tensor, step: int | None = None) -> None:
        """Record one number (a float or a one-element tensor) for this step."""
        if not self.enabled:
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"scalar {name!r} needs one number, got shape {list(value.shape)}")
            value = value.detach().clone()  # stays on its device until collection
        self.record_row("scalars", self.current_step if step is None else step, name, value)

    def gradients(self, model: nn.Module, when: str) -> None:
        """Record each parameter's gradient norm and first values now ("before"/"after" sync)."""
        if not self.enabled:
            return
        if when not in WHEN:
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        module = unwrap(model)
        params = [p for p in module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
        layout = self.layout(params, parameter_names(module))
        self.record_grads(self.current_step, when, -1, flat, layout)

    def samples(self, indices: Iterable[int], epoch: int) -> None:
        """Record the dataset indices this rank used in `epoch`, in order."""
        if self.enabled:
            for position, index in enumerate(indices):
                self.record_row("samples", epoch, position, int(index))

    # -- watchers: hooks that record for you ------------------------------------------------

    def watch_ddp(self, ddp_model: nn.parallel.DistributedDataParallel,
                  hook: Callable | None = None, state: Any = None, grads: bool = True) -> None:
        """Record every all-reduce DDP issues and, with `grads`, gradients before and after it.

        Installs a comm hook that runs DDP's default all-reduce, or `hook` (with `state`).
        `grads` reads every gradient twice a step; grads=False records the calls only.
        """
        if self.enabled:
            comm.watch(self, ddp_model, hook, state, grads)

    def watch_batchnorm(self, model: nn.Module) -> None:
        """Record every BatchNorm layer's batch statistics and running buffers each step."""
        if self.enabled:
            batchnorm.watch(self, model)

    def watch_sampler(self, sampler: Iterable[int]) -> Iterable[int]:
        """The sampler, recording the indices it yields; each pass over it is one epoch."""
        return RecordedSampler(sampler, self) if self.enabled else sampler

    # -- getting the records out ------------------------------------------------------------

    def telemetry(self) -> Telemetry:
        """This process's records as a Telemetry (for use without the launcher)."""
        return Telemetry.from_payloads([self.export()] if self.enabled else [])

    def save(self, directory: str | os.PathLike | None = None) -> Path | None:
        """Write this rank's records to `directory`/rank<N>.json (default $COURSE_TELEMETRY_DIR)."""
        if not self.enabled:
            return None
        directory = directory or os.environ.get(transport.ENV_DIR)
        if not directory:
            raise ValueError(f"save() needs a directory, or ${transport.ENV_DIR} set")
        return transport.write(self.export(), directory)

    def export(self) -> dict[str, Any]:
        """The records as plain data: {"rank", "world_size", "tables": {table: {column: list}}}."""
        tables = {name: _columns(COLUMNS[name], rows) for name, rows in self._rows.items()}
        tables["grads"] = grad_rows(self._grads)
        return {"rank": self.rank, "world_size": self.world_size, "tables": tables}

    # -- for the watchers -------------------------------------------------------------------

    def record_row(self, table: str, *values: Any) -> None:
        """Append one row (in the table's column order, without rank) to a table."""
        self._rows[table].append(values)

    def record_grads(self, step: int, when: str, bucket: int, flat: torch.Tensor,
                     layout: Layout) -> None:
        """Summarise a flat buffer of gradients laid out as `layout`."""
        self._grads.append(summarise(step, when, bucket, flat, layout))

    def layout(self, params: list[torch.Tensor], names: dict[int, tuple[int, str]]) -> Layout:
        """The (cached) layout of these parameters' gradients concatenated in this order."""
        key = tuple(map(id, params))
        if key not in self._layouts:
            self._layouts[key] = make_layout(params, names, self.raw_values)
        return self._layouts[key]


class _Span:
    """Context manager behind Recorder.span(): one row in the spans table."""

    __slots__ = ("rec", "name", "step", "start")

    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def __enter__(self) -> None:
        devices.wait_for_gpu()  # on a GPU, the edges are when the work ran, not was queued
        self.step, self.start = self.rec.current_step, now()

    def __exit__(self, *exc: object) -> None:
        devices.wait_for_gpu()
        self.rec.record_row("spans", self.step, self.name, self.start, now())


def _rank_and_world_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _plain(value: Any) -> Any:
    """A tensor as a number or list; a GPU timestamp (devices.GpuTime) as its seconds."""
    if isinstance(value, devices.GpuTime):
        return float(value)
    return value.tolist() if isinstance(value, torch.Tensor) else value


def _columns(names: tuple[str, ...], rows: list[tuple]) -> dict[str, list]:
    columns = zip(*rows) if rows else [()] * len(names)
    return {name: [_plain(v) for v in column] for name, column in zip(names, columns)}
