"""Probe: the collectives the learner's code calls itself (dist.all_reduce and friends).

DDP's own all-reduces run in its C++ reducer and are not seen here (the ddp probe and the
flight recorder see those); its buffer broadcast before a forward is noted, with whether
that forward was an evaluation (the desync detector tells X3 from S1 by it). A collective
that calls another (all_gather_object calls all_gather) is recorded once, as the learner
called it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.xray import record

OPS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
       "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
       "all_to_all_single", "barrier", "monitored_barrier", "all_gather_object",
       "gather_object", "broadcast_object_list", "scatter_object_list", "send", "recv",
       "isend", "irecv"]

_inside = threading.local()


def install() -> None:
    """Wrap each collective in torch.distributed and in c10d, where torch's own code calls
    it, and note DDP's buffer broadcasts (with the grad mode of the forward that made it)."""
    DDP._sync_buffers = _buffer_sync(DDP._sync_buffers)
    for name in OPS:
        real = getattr(c10d, name, None)
        if real is None:
            continue
        wrapped = _wrap(name, real)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is real:
            setattr(dist, name, wrapped)


def _buffer_sync(real: Any) -> Any:
    @functools.wraps(real)
    def sync_buffers(self: DDP) -> Any:
        with record.guard():  # no stack walk: once per forward, and the forward is torch's
            record.note("ddp_buffer_sync", "", grad=torch.is_grad_enabled(),
                        training=bool(self.training))
        return real(self)
    return sync_buffers


def _wrap(name: str, real: Any) -> Any:
    @functools.wraps(real)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return real(*args, **kwargs)
        _inside.depth = 1
        try:
            with record.guard():
                record.note("collective", op=name, shapes=_shapes(args, kwargs),
                            group=_group_size(kwargs))
            return real(*args, **kwargs)
        finally:
            _inside.depth = 0
    return collective


def _shapes(args: tuple, kwargs: dict) -> list[list[int]]:
    """The shapes of the tensors passed (the first level of lists looked into)."""
    shapes = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else [value]
        shapes += [list(t.shape) for t in items if isinstance(t, torch.Tensor)]
    return shapes[:4]


def _group_size(kwargs: dict) -> int:
    group = kwargs.get("group")
    try:
        return dist.get_world_size(group) if group is not None else dist.get_world_size()
    except (RuntimeError, ValueError):
        return 0
