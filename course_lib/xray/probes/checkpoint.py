"""Probe: checkpoints: torch.save and torch.load of files, and Module.load_state_dict.

A save notes the file, when it began and ended, its size and how many of the state dict's
keys start with "module." (DDP's prefix); a load notes the file, when it began and ended,
the file's size when it began, and its error if it failed; load_state_dict notes whether
the module was the DDP wrapper, the keys with the prefix, and the outcome. Saves and loads
that torch's own code makes (torch.distributed.checkpoint's files) are not noted.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from course_lib.xray import record
from course_lib.xray.probes import ddp
from course_lib.xray.probes.patching import Patch, apply

PREFIX = "module."
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def patches() -> list[Patch]:
    """torch.save, torch.load and nn.Module.load_state_dict."""
    return [Patch(torch, "save", _save), Patch(torch, "load", _load),
            Patch(nn.Module, "load_state_dict", _load_state_dict)]


def install() -> None:
    apply(patches())


def _from_torch() -> bool:
    """True when torch's own code (not the learner's) called the wrapped function."""
    return sys._getframe(2).f_code.co_filename.startswith(_TORCH)


def file_of(f: Any) -> str:
    """The absolute path a save or load uses, or "" for an in-memory buffer."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return os.path.abspath(name) if isinstance(name, str) and os.path.isfile(name) else ""


def prefixed_keys(obj: Any) -> tuple[int, int]:
    """Keys starting with "module." and all keys, in a state dict or in the dicts it holds
    one level down ({"model": state_dict, "optimizer": ...})."""
    if not isinstance(obj, dict):
        return 0, 0
    dicts = [obj] + [v for v in obj.values() if isinstance(v, dict)]
    keys = [k for d in dicts for k in d if isinstance(k, str)]
    return sum(k.startswith(PREFIX) for k in keys), len(keys)


def _sync_points() -> dict[str, int]:
    """How far this rank is in the sequences that order ranks: the collectives it called
    (the collectives probe's events) and DDP's synced forwards and backwards."""
    forwards, backwards = ddp.progress()
    calls = sum(e["kind"] == "collective" for e in record.events())
    return {"collectives": calls, "ddp_forwards": forwards, "ddp_backwards": backwards}


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _save(real: Any) -> Any:
    @functools.wraps(real)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        event: dict[str, Any] = {}
        with record.guard():
            path = "" if _from_torch() else file_of(f)
            if path:
                prefixed, keys = prefixed_keys(obj)
                event = record.note("save", path=path, prefixed=prefixed, keys=keys)
        real(obj, f, *args, **kwargs)
        if event:
            with record.guard():
                event.update(t_end=time.monotonic(), size=_size(path), **_sync_points())
    return save


def _load(real: Any) -> Any:
    @functools.wraps(real)
    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        event: dict[str, Any] = {}
        with record.guard():
            path = "" if _from_torch() else file_of(f)
            if path:
                event = record.note("load", None, path=path, size=_size(path),
                                    **_sync_points())
        if not event:
            return real(f, *args, **kwargs)
        try:
            out = real(f, *args, **kwargs)
        except Exception as exc:
            event.update(t_end=time.monotonic(), error=f"{type(exc).__name__}: {exc}"[:300])
            raise
        event.update(t_end=time.monotonic())
        return out
    return load


def _load_state_dict(real: Any) -> Any:
    @functools.wraps(real)
    def load_state_dict(self: nn.Module, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        event: dict[str, Any] = {}
        with record.guard():
            if not _from_torch():
                event = _note_load_state_dict(self, state_dict, args, kwargs)
        if not event:
            return real(self, state_dict, *args, **kwargs)
        try:
            out = real(self, state_dict, *args, **kwargs)
        except Exception as exc:
            event["error"] = f"{type(exc).__name__}: {exc}"[:300]
            raise
        event.update(missing=len(getattr(out, "missing_keys", [])),
                     unexpected=len(getattr(out, "unexpected_keys", [])))
        return out
    return load_state_dict


def _note_load_state_dict(module: nn.Module, state_dict: Any, args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    prefixed, keys = prefixed_keys(state_dict)
    strict = kwargs.get("strict", args[0] if args else True)
    return record.note("load_state_dict", module=type(module).__name__,
                       wrapper=isinstance(module, DDP), prefixed=prefixed, keys=keys,
                       strict=bool(strict))
