"""Pack the function and its arguments by value, and explain what cannot be packed."""

from __future__ import annotations

import importlib
import inspect
import io
import marshal
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle


class UnpicklableError(TypeError):
    """Something the ranks need cannot be sent to them; raised before any worker starts."""


def _code_by_marshal(code: types.CodeType) -> tuple[Callable[[bytes], Any], tuple[bytes]]:
    """A code object exactly as compiled: its file name (a notebook cell's) and line table
    kept, so a rank's traceback can show the learner's line. cloudpickle 3.1.3 renames
    every file '<dynamic-code>'. The ranks run this same interpreter, so marshal fits."""
    return marshal.loads, (marshal.dumps(code),)


class CoursePickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no types
    """cloudpickle, plus: code keeps its file name, and a module object that Python keeps
    in sys.modules (torch.backends.cudnn is an instance of a module subclass) goes by
    reference, so a function may set torch.backends.cudnn.deterministic."""

    dispatch_table = cloudpickle.Pickler.dispatch_table.new_child(
        {types.CodeType: _code_by_marshal})

    def reducer_override(self, obj: Any) -> Any:
        name = getattr(obj, "__name__", None)
        if (isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType
                and isinstance(name, str) and sys.modules.get(name) is obj):
            return importlib.import_module, (name,)
        return super().reducer_override(obj)


def dumps(obj: Any) -> bytes:
    """cloudpickle.dumps through CoursePickler."""
    with io.BytesIO() as buffer:
        CoursePickler(buffer).dump(obj)
        return buffer.getvalue()


def pack(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """Pickle (fn, args, kwargs): notebook functions, classes and globals go by value."""
    try:
        return dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets explained
        culprit = find_culprit(fn, args, kwargs)
        raise UnpicklableError(
            f"cannot send {culprit} to the worker processes: {exc}.\n"
            "Workers are separate processes, so everything the function uses is copied to "
            "them. Locks, open files, sockets, generators and live process groups cannot be "
            "copied: create such objects inside the function instead."
        ) from None


def find_culprit(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Name the first argument, global or closure variable that fails to pickle."""
    for name, value in _candidates(fn, args, kwargs):
        try:
            dumps(value)
        except Exception:  # noqa: BLE001 - any pickling failure: name what failed
            return f"{name} (a {type(value).__name__})"
    return f"the function {getattr(fn, '__name__', fn)!r}"


def _candidates(fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for i, value in enumerate(args):
        yield f"argument {i}", value
    for key, value in kwargs.items():
        yield f"keyword argument {key!r}", value
    try:
        closure = inspect.getclosurevars(fn)
    except TypeError:  # not a Python function (a callable object, a builtin)
        yield "the callable", fn
        return
    for name, value in {**closure.nonlocals, **closure.globals}.items():
        if not inspect.ismodule(value):
            yield f"the variable {name!r}", value
