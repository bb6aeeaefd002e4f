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
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import FrameType
from typing import Any

import torch

from course_lib.xray import record
from course_lib.xray.probes.data import fingerprint, first_tensor
from course_lib.xray.probes.patching import Patch, apply

MAX_FORWARDS = 4  # per parallelized module and grad mode: the first forwards are noted
MAX_ROWS = 64  # samples per fingerprint
MAX_KEYS = 8  # plan keys kept

_CALL = getattr(getattr(torch.nn.Module, "_call_impl", None), "__code__", None)
_state = {"depth": 0}  # calls nest (a plan's keys, a style's _apply): note the outermost
_at_line: dict[str, int] = {}  # calls made at each line, to match them across ranks


def patches() -> list[Patch]:
    """parallelize_module, where torch defines it and where learners import it from, and
    the _apply of each parallel style torch defines."""
    from torch.distributed.tensor import parallel
    from torch.distributed.tensor.parallel import api, style

    styles = [cls for cls in vars(style).values() if isinstance(cls, type)
              and issubclass(cls, style.ParallelStyle) and cls is not style.ParallelStyle
              and "_apply" in cls.__dict__]
    return [Patch(api, "parallelize_module", _parallelize),
            Patch(parallel, "parallelize_module", _parallelize),
            *(Patch(cls, "_apply", _style_apply) for cls in styles)]


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
    record.note("tp_plan", where, key=key, group=[int(r) for r in mesh.mesh.flatten().tolist()],
                dim=(mesh.mesh_dim_names or ("",))[0],
                mesh_shape=[int(n) for n in root.mesh.shape],
                mesh_dims=list(root.mesh_dim_names or ()), plan=plan,
                module=type(module).__name__)
    counts = {True: 0, False: 0}
    module.register_forward_pre_hook(functools.partial(_fed, key, counts), with_kwargs=True)


def _fed(key: str, counts: dict[bool, int], module: Any, args: Any, kwargs: Any) -> None:
    """A forward pre-hook: what this rank fed the parallelized module (its first forwards
    in each grad mode); a DTensor input is left alone (reading it would communicate)."""
    with record.guard(probe="tensor_parallel"):
        grad = torch.is_grad_enabled()
        if counts[grad] >= MAX_FORWARDS:
            return
        counts[grad] += 1
        rows = first_tensor((args, kwargs))
        if rows is None or type(rows) is not torch.Tensor:
            return
        record.note("tp_input", plan=key, number=counts[grad] - 1, grad=grad,
                    data=_from_outside(rows), rows=int(rows.shape[0]),
                    fingerprint=fingerprint(rows[:MAX_ROWS]))


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
