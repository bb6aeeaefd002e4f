"""Pack the function and its arguments by value, and explain what cannot be packed."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import cloudpickle


class UnpicklableError(TypeError):
    """Something the ranks need cannot be sent to them; raised before any worker starts."""


def pack(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle (fn, args, kwargs): notebook functions, classes and globals go by value."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets explained
        culprit = find_culprit(fn, args, kwargs)
        raise UnpicklableError(
            f"cannot send {culprit} to the worker processes: {exc}.\n"
            "Workers are separate processes, so everything the function uses is copied to "
            "them. Locks, open files, sockets, generators and live process groups cannot be "
            "copied: create such objects inside the function instead."
        ) from None


def find_culprit(fn: Callable, args: tuple, kwargs: dict) -> str:
    """Name the first argument, global or closure variable that fails to pickle."""
    for name, value in _candidates(fn, args, kwargs):
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001 - any pickling failure: name what failed
            return f"{name} (a {type(value).__name__})"
    return f"the function {getattr(fn, '__name__', fn)!r}"


def _candidates(fn: Callable, args: tuple, kwargs: dict):
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
