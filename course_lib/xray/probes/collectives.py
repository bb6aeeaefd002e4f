"""Probe: the collectives the learner's code calls itself (dist.all_reduce and friends).

One recorder for the x-ray and the exercise checks: OPS is the table of collectives, each
with its tensor argument and whether it combines the ranks' values. The x-ray's install()
wraps them for the rank's life and notes a "collective" event per call; a check's
`recorded()` wraps them only while its block runs and lists the calls:

    with recorded() as calls:
        fn(model)
    [c.op for c in calls]  # ["broadcast", "broadcast"]

Each op is wrapped in torch.distributed and in c10d, where torch's own code calls it (a DDP
comm hook's all_reduce is seen). A collective that calls another (all_gather_object calls
all_gather) is recorded once, as the learner called it. DDP's own all-reduces run in its
C++ reducer and are not seen (the ddp probe and the flight recorder see those); its buffer
broadcast before a forward is noted, with whether that forward was an evaluation (the
desync detector tells X3 from S1 by it).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply


@dataclass(frozen=True)
class Op:
    """A collective: the name of its tensor argument ("" for none) and whether it combines
    the ranks' values (a reduce or a gather: a metric computed with it covers every rank)."""

    tensor: str
    combines: bool = False


OPS = {
    "all_reduce": Op("tensor", True), "reduce": Op("tensor", True),
    "broadcast": Op("tensor"), "all_gather": Op("tensor", True),
    "all_gather_into_tensor": Op("input_tensor", True), "gather": Op("tensor", True),
    "scatter": Op("tensor"), "reduce_scatter": Op("input_list", True),
    "reduce_scatter_tensor": Op("input", True), "all_to_all": Op("input_tensor_list"),
    "all_to_all_single": Op("input"), "barrier": Op(""), "monitored_barrier": Op(""),
    "all_gather_object": Op("obj", True), "gather_object": Op("obj", True),
    "broadcast_object_list": Op("object_list"),
    "scatter_object_list": Op("scatter_object_input_list"), "send": Op("tensor"),
    "recv": Op("tensor"), "isend": Op("tensor"), "irecv": Op("tensor"),
}

# (op, args, kwargs) before the call runs
Listener = Callable[[str, tuple[Any, ...], dict[str, Any]], None]

_inside = threading.local()
_listeners: list[Listener] = []
_originals: dict[str, Any] = {}  # op -> the real function, while the ops are wrapped


@dataclass(frozen=True)
class Call:
    """One collective call: its name, and the storage of its tensor argument (0 if none)."""

    op: str
    storage: int


def install() -> None:
    """For the x-ray: note every collective call for the rank's life, and DDP's buffer
    broadcasts (with the grad mode of the forward that made it)."""
    apply(patches())  # first: a renamed private name raises before anything is wrapped
    _wrap_all()  # the public ops this torch has (the others are skipped)
    _listeners.append(_note)


def patches() -> list[Patch]:
    """DDP's buffer broadcast (the ops themselves: _wrap_all, shared with recorded())."""
    return [Patch(DDP, "_sync_buffers", _buffer_sync)]


@contextmanager
def recorded() -> Iterator[list[Call]]:
    """Every collective of OPS called inside the block, in order; the functions are wrapped
    only while it runs (unless the x-ray's probe wraps them already)."""
    calls: list[Call] = []

    def listen(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        calls.append(Call(op, storage_of(_tensor_argument(op, args, kwargs))))

    wrapped_here = _wrap_all()
    _listeners.append(listen)
    try:
        yield calls
    finally:
        _listeners.remove(listen)
        if wrapped_here:
            _unwrap_all()


def storage_of(value: object) -> int:
    """The address of a tensor's storage (views share it with their base); 0 for others."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().data_ptr()
    return 0


def _wrap_all() -> bool:
    """Wrap each op in c10d and torch.distributed; False when they are wrapped already."""
    if _originals:
        return False
    for name in OPS:
        real = getattr(c10d, name, None)
        if real is None:
            continue
        _originals[name] = real
        wrapped = _wrap(name, real)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is real:
            setattr(dist, name, wrapped)
    return True


def _unwrap_all() -> None:
    for name, real in _originals.items():
        if getattr(dist, name, None) is getattr(c10d, name):
            setattr(dist, name, real)
        setattr(c10d, name, real)
    _originals.clear()


def _wrap(name: str, real: Any) -> Any:
    @functools.wraps(real)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "depth", 0):
            return real(*args, **kwargs)
        _inside.depth = 1
        try:
            for listen in list(_listeners):
                listen(name, args, kwargs)
            return real(*args, **kwargs)
        finally:
            _inside.depth = 0
    return collective


@functools.cache
def _signature(op: str) -> inspect.Signature:
    return inspect.signature(_originals.get(op) or getattr(c10d, op))


def _tensor_argument(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The value passed as the op's tensor argument (None when none was)."""
    if not OPS[op].tensor:
        return None
    try:
        bound = _signature(op).bind_partial(*args, **kwargs)
    except TypeError:  # the call is wrong: torch itself will say how
        return None
    return bound.arguments.get(OPS[op].tensor)


def _note(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with record.guard():
        record.note("collective", op=op, shapes=_shapes(args, kwargs),
                    group=_group_size(kwargs))


def _buffer_sync(real: Any) -> Any:
    @functools.wraps(real)
    def sync_buffers(self: DDP) -> Any:
        with record.guard():  # no stack walk: once per forward, and the forward is torch's
            record.note("ddp_buffer_sync", "", grad=torch.is_grad_enabled(),
                        training=bool(self.training))
        return real(self)
    return sync_buffers


def _shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[list[int]]:
    """The shapes of the tensors passed (the first level of lists looked into)."""
    shapes = []
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else [value]
        shapes += [list(t.shape) for t in items if isinstance(t, torch.Tensor)]
    return shapes[:4]


def _group_size(kwargs: dict[str, Any]) -> int:
    group = kwargs.get("group")
    try:
        return dist.get_world_size(group) if group is not None else dist.get_world_size()
    except (RuntimeError, ValueError):
        return 0
