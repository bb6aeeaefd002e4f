"""Probe: which ranks form one tensor-parallel group, and what each rank fed its model.

Wraps parallelize_module (torch.distributed.tensor.parallel): the ranks of the mesh it was
given (this rank's tensor-parallel group), the whole mesh's shape and dimension names, the
plan's keys and the call's line; and puts a forward pre-hook on the module it parallelized
that notes, for its first forwards, a fingerprint of the first plain tensor it was fed (one
number per sample, as the data probe's). The ranks of one group compute one forward
together, so they must be fed the same inputs (TP4, TP8).

A function shipped from a notebook keeps the parallelize_module it was pickled with (the
real one: the probes are installed after it arrives), so each parallel style's `_apply`,
which every call reaches, is wrapped too: a call seen only there is noted there.

Also wraps torch.manual_seed (each seed, with its line) and, once a module was
parallelized on this rank, F.dropout (which nn.Dropout calls): for its first training
calls at each line, a fingerprint of its input and of the random generator it draws its
mask from. A replicated activation (the same on every rank of a group) must get the same
mask on each (TP5).
"""

from __future__ import annotations

import functools
import inspect
import sys
import zlib
from types import FrameType
from typing import Any

import torch

from course_lib.xray import record
from course_lib.xray.probes.data import fingerprint, first_tensor
from course_lib.xray.probes.patching import Patch, apply

MAX_FORWARDS = 4  # noted per parallelized module and grad mode, and per dropout line
MAX_ROWS = 64  # samples per fingerprint
MAX_KEYS = 8  # plan keys kept
MAX_SEEDS = 16  # torch.manual_seed calls noted (a seed per step would be many)
MAX_DROPOUTS = 32  # dropout calls noted over the run (each looks up its line)

_CALL = getattr(getattr(torch.nn.Module, "_call_impl", None), "__code__", None)
# depth: calls nest (a plan's keys in a style's _apply), the outermost is noted; plans:
# modules parallelized on this rank so far; seeds, dropouts: events noted so far
_state = {"depth": 0, "plans": 0, "seeds": 0, "dropouts": 0}
_at_line: dict[str, int] = {}  # calls made at each line, to match them across ranks
_dropouts: dict[str, int] = {}  # training dropout calls noted per line


def patches() -> list[Patch]:
    """parallelize_module, where torch defines it and where learners import it from, the
    _apply of each parallel style torch defines, torch.manual_seed and F.dropout."""
    from torch.distributed.tensor import parallel
    from torch.distributed.tensor.parallel import api, style

    styles = [cls for cls in vars(style).values() if isinstance(cls, type)
              and issubclass(cls, style.ParallelStyle) and cls is not style.ParallelStyle
              and "_apply" in cls.__dict__]
    return [Patch(api, "parallelize_module", _parallelize),
            Patch(parallel, "parallelize_module", _parallelize),
            *(Patch(cls, "_apply", _style_apply) for cls in styles),
            Patch(torch, "manual_seed", _manual_seed),
            Patch(torch.random, "manual_seed", _manual_seed),
            Patch(torch.nn.functional, "dropout", _dropout)]


def install() -> None:
    apply(patches())


def _outermost(real: Any, note: Any) -> Any:
    """Call `real`; when no other wrapped call encloses this one, `note` what it did."""
    @functools.wraps(real)
    def call(*args: Any, **kwargs: Any) -> Any:
        _state["depth"] += 1
        try:
            module = real(*args, **kwargs)
        finally:
            _state["depth"] -= 1
        if _state["depth"] == 0:
            with record.guard(probe="tensor_parallel"):
                note(real, module, args, kwargs)
        return module
    return call


def _parallelize(real: Any) -> Any:
    return _outermost(real, _from_call)


def _style_apply(real: Any) -> Any:
    return _outermost(real, _from_style)


def _from_call(real: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    bound = inspect.signature(real).bind(*args, **kwargs).arguments
    plan = bound.get("parallelize_plan")
    keys = [str(k) for k in plan][:MAX_KEYS] if isinstance(plan, dict) else [type(plan).__name__]
    _note_plan(module, bound.get("device_mesh"), keys)


def _from_style(real: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    bound = inspect.signature(real).bind(*args, **kwargs).arguments
    _note_plan(module, bound.get("device_mesh"), [type(bound.get("self")).__name__])


def _note_plan(module: Any, mesh: Any, plan: list[str]) -> None:
    """Note the mesh the module was parallelized over, and hook the module's forward."""
    if mesh is None or not isinstance(module, torch.nn.Module):
        return
    where = record.where(3)
    _at_line[where] = _at_line.get(where, 0) + 1
    key = f"{where}#{_at_line[where]}"
    root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
    _state["plans"] += 1
    record.note("tp_plan", where, key=key, group=[int(r) for r in mesh.mesh.flatten().tolist()],
                dim=(mesh.mesh_dim_names or ("",))[0],
                mesh_shape=[int(n) for n in root.mesh.shape],
                mesh_dims=list(root.mesh_dim_names or ()), plan=plan,
                module=type(module).__name__)
    counts = {True: 0, False: 0}
    module.register_forward_pre_hook(functools.partial(_fed, key, counts), with_kwargs=True)


def _fed(key: str, counts: dict[bool, int], module: Any, args: Any, kwargs: Any) -> None:
    """A forward pre-hook: what this rank fed the parallelized module (its first forwards
    in each grad mode); of a DTensor input (the plan laid it out) only its placements:
    reading its values would communicate."""
    with record.guard(probe="tensor_parallel"):
        grad = torch.is_grad_enabled()
        if counts[grad] >= MAX_FORWARDS:
            return
        counts[grad] += 1
        rows = first_tensor((args, kwargs))
        if rows is None:
            return
        local = _local(rows)
        record.note("tp_input", plan=key, number=counts[grad] - 1, grad=grad,
                    data=local and _from_outside(rows), rows=int(rows.shape[0]),
                    fingerprint=fingerprint(rows[:MAX_ROWS]) if local else [],
                    layout="" if local else str(getattr(rows, "placements", "")))


def _local(t: Any) -> bool:
    """A tensor this rank holds whole (a plain one, or the wrapper of an all-reduce's result
    that RowwiseParallel hands back), not a DTensor: reading a DTensor would communicate."""
    return isinstance(t, torch.Tensor) and not hasattr(t, "placements")


def _from_outside(rows: torch.Tensor) -> bool:
    """True when `rows` is what the learner's code passed to the outermost module call on
    the stack (Module._call_impl's `args`): the data it fed the model, not an activation
    that another layer computed (dropout there may differ per rank on purpose)."""
    frame: FrameType | None = sys._getframe(1)
    outermost = None
    while frame is not None:
        if frame.f_code is _CALL:
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return False
    given = outermost.f_locals
    return first_tensor((given.get("args", ()), given.get("kwargs", {}))) is rows


def _manual_seed(real: Any) -> Any:
    @functools.wraps(real)
    def manual_seed(seed: Any) -> Any:
        with record.guard(probe="tensor_parallel"):
            where = record.where(2) if _state["seeds"] < MAX_SEEDS and not _in_worker() else ""
            if where:  # "" from torch's own calls too
                _state["seeds"] += 1
                record.note("seed", where, value=int(seed))
        return real(seed)
    return manual_seed


def _dropout(real: Any) -> Any:
    @functools.wraps(real)
    def dropout(input: Any, p: float = 0.5, training: bool = True, *args: Any,
                **kwargs: Any) -> Any:
        if _state["plans"] and _state["dropouts"] < MAX_DROPOUTS and training and p > 0 \
                and not _in_worker():
            with record.guard(probe="tensor_parallel"):
                _note_dropout(input, p)
        return real(input, p, training, *args, **kwargs)
    return dropout


def _in_worker() -> bool:
    """In a DataLoader worker process (its seed, its augmentation): not the rank's own."""
    return torch.utils.data.get_worker_info() is not None


def _note_dropout(rows: Any, p: float) -> None:
    """A dropout in training after a module was parallelized: its input and the state of
    the generator its mask comes from (the first calls at each line)."""
    where = record.where(3)
    number = _dropouts.get(where, 0)
    if number >= MAX_FORWARDS or not _local(rows) or rows.dim() < 1:
        return
    _dropouts[where] = number + 1
    _state["dropouts"] += 1
    state = (torch.cuda.get_rng_state(rows.device) if rows.is_cuda
             else torch.get_rng_state())
    record.note("tp_dropout", where, number=number, p=float(p),
                fingerprint=fingerprint(rows[:MAX_ROWS]),
                rng=zlib.crc32(bytes(state.tolist())))
