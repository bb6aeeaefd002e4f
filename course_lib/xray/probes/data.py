"""Probe: which samples each rank reads, pass by pass, and whether it trained on them.

Wraps DataLoader (its arguments, each pass over it, the indices each batch came from,
mapped through Subset to the base dataset, and a fingerprint of each sample's values),
DistributedSampler (its settings, set_epoch calls), autograd's backward (a pass during
which backward ran is a training pass; one without is an evaluation) and Join (the context
manager that lets ranks with fewer batches finish early).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Subset
from torch.utils.data import dataloader as dl

from course_lib.xray import record
from course_lib.xray.probes.patching import Patch, apply

_state: dict[str, Any] = {"samplers": 0, "current": None, "opening": None}
_at_line: dict[str, int] = {}  # loaders made at each line, to match them across ranks


def patches() -> list[Patch]:
    """DataLoader, its iterators, DistributedSampler, autograd's backward and Join."""
    return [Patch(DataLoader, "__init__", _loader_init),
            Patch(DataLoader, "__iter__", _loader_iter),
            Patch(dl._BaseDataLoaderIter, "_next_index", _next_index),
            Patch(dl._BaseDataLoaderIter, "__next__", _next),
            Patch(DistributedSampler, "__init__", _sampler_init),
            Patch(DistributedSampler, "set_epoch", _set_epoch),
            Patch(torch.autograd, "backward", _backward),
            Patch(Join, "__init__", _join_init)]


def install() -> None:
    apply(patches())


def _join_init(real: Any) -> Any:
    @functools.wraps(real)
    def init(self: Join, joinables: Any, enable: bool = True, *args: Any, **kwargs: Any) -> None:
        with record.guard():
            record.note("join", enable=bool(enable))  # uneven inputs, handled (model.join())
        real(self, joinables, enable, *args, **kwargs)
    return init


def _sampler_key(sampler: Any) -> int:
    """A number for the sampler, the same on every rank that makes them in the same order."""
    if sampler is None:
        return 0
    key = record.tagged(sampler, "key", int)
    if key is None:
        _state["samplers"] += 1
        key = _state["samplers"]
        try:
            record.tag(sampler, "key", key)
        except (AttributeError, TypeError):  # a list of indices, a class with __slots__
            return 0
    return key


def _loader_init(real: Any) -> Any:
    @functools.wraps(real)
    def init(self: DataLoader[Any], dataset: Any, *args: Any, **kwargs: Any) -> None:
        with record.guard():
            _note_loader(self, args, kwargs)
        real(self, dataset, *args, **kwargs)
    return init


def _note_loader(loader: DataLoader[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Note a DataLoader's sampler and shuffle before it is made (it may refuse them)."""
    where = record.where(3)
    sampler = kwargs.get("sampler", args[2] if len(args) > 2 else None)
    shuffle = kwargs.get("shuffle", args[1] if len(args) > 1 else None)
    _at_line[where] = _at_line.get(where, 0) + 1
    key = f"{where}#{_at_line[where]}"
    record.tag(loader, "key", key)
    record.note("loader", where, key=key, shuffle=bool(shuffle),
                sampler=type(sampler).__name__ if sampler is not None else "",
                sampler_key=_sampler_key(sampler))


def _loader_iter(real: Any) -> Any:
    """A pass begins before DataLoader makes (or, persistent, resets) its iterator: with
    worker processes that already takes the first prefetch_factor * num_workers batches'
    indices from the sampler, in this process (dataloader.py _reset -> _try_put_index)."""
    @functools.wraps(real)
    def iterate(self: DataLoader[Any]) -> Any:
        current = None
        with record.guard():
            current = _new_pass(self)
        _state["opening"] = current
        try:
            it = real(self)
        finally:
            _state["opening"] = None
        if current is not None:
            with record.guard():
                record.tag(it, "pass", current)
        return it
    return iterate


def _new_pass(loader: DataLoader[Any]) -> dict[str, Any]:
    sampler = loader.sampler
    key = record.tagged(loader, "key", str) or ""
    previous = sum(1 for e in record.events() if e["kind"] == "pass" and e["loader"] == key)
    dist_sampler = sampler if isinstance(sampler, DistributedSampler) else None
    return record.note(
        "pass", loader=key, number=previous, sampler_key=_sampler_key(sampler),
        sampler=type(sampler).__name__, random=isinstance(sampler, RandomSampler) or bool(
            dist_sampler is not None and dist_sampler.shuffle),
        distributed=_sampler_settings(dist_sampler), dataset_len=_len(loader.dataset),
        grad=torch.is_grad_enabled(), indices=[], sizes=[], fingerprints=[],
        backward=0, done=False, base=_index_maps(loader.dataset))


def _sampler_settings(sampler: DistributedSampler[Any] | None) -> dict[str, Any] | None:
    if sampler is None:
        return None
    return {"num_replicas": sampler.num_replicas, "rank": sampler.rank,
            "shuffle": sampler.shuffle, "drop_last": sampler.drop_last,
            "total_size": sampler.total_size, "epoch": sampler.epoch}


def _len(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - no __len__, or one that raises (IterableDataset)
        return None


def _index_maps(dataset: Any) -> str:
    """The base dataset's name, after Subsets (whose indices are mapped, see _base_index)."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return type(dataset).__name__


def _base_index(dataset: Any, index: Any) -> Any:
    while isinstance(dataset, Subset) and isinstance(index, int):
        index = int(dataset.indices[index])
        dataset = dataset.dataset
    return index


def _next_index(real: Any) -> Any:
    @functools.wraps(real)
    def next_index(self: Any) -> Any:
        index = real(self)
        current = _state["opening"] or record.tagged(self, "pass", dict)
        if current is not None:
            with record.guard():
                batch = index if isinstance(index, list) else [index]
                current["indices"].append([_base_index(self._dataset, i) for i in batch
                                           if isinstance(i, int)])
        return index
    return next_index


def _next(real: Any) -> Any:
    @functools.wraps(real)
    def next_batch(self: Any) -> Any:
        current = record.tagged(self, "pass", dict)
        try:
            data = real(self)
        except StopIteration:
            if current is not None:
                current["done"] = True
                current["stopped"] = time.monotonic()
            raise
        if current is not None:
            with record.guard():
                _note_batch(current, data)
        return data
    return next_batch


def _note_batch(current: dict[str, Any], data: Any) -> None:
    rows = first_tensor(data)
    current["sizes"].append(int(rows.shape[0]) if rows is not None else 1)
    current["fingerprints"].append(fingerprint(rows))
    current["end"] = time.monotonic()
    _state["current"] = current


def first_tensor(data: Any) -> torch.Tensor | None:
    """The batch's first tensor with a batch dimension (inputs first, as a loop unpacks)."""
    if isinstance(data, torch.Tensor):
        return data if data.dim() >= 1 else None
    items = data.values() if isinstance(data, dict) else data
    if isinstance(items, (list, tuple)) or isinstance(data, dict):
        for item in items:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


FINGERPRINT_VALUES = 1024  # values per sample summed, spread over the sample (big inputs)


def fingerprint(rows: torch.Tensor | None) -> list[float]:
    """One number per sample: the sum of up to FINGERPRINT_VALUES of its values, evenly
    spaced (the same sample gives the same number; different ones almost never do)."""
    if rows is None or not (rows.is_floating_point() or rows.dtype in (torch.int64, torch.int32)):
        return []
    with torch.no_grad():
        flat = rows.detach().reshape(rows.shape[0], -1)
        step = max(1, flat.shape[1] // FINGERPRINT_VALUES)
        return flat[:, ::step].double().sum(1).cpu().tolist()


def _sampler_init(real: Any) -> Any:
    @functools.wraps(real)
    def init(self: DistributedSampler[Any], *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        with record.guard():
            record.note("sampler", key=_sampler_key(self), **_sampler_settings(self) or {},
                        dataset_len=_len(self.dataset))
    return init


def _set_epoch(real: Any) -> Any:
    @functools.wraps(real)
    def set_epoch(self: DistributedSampler[Any], epoch: int) -> None:
        with record.guard():
            record.note("set_epoch", sampler_key=_sampler_key(self), epoch=int(epoch))
        real(self, epoch)
    return set_epoch


def _backward(real: Any) -> Any:
    @functools.wraps(real)
    def backward(*args: Any, **kwargs: Any) -> Any:
        current = _state["current"]
        if current is not None:
            current["backward"] += 1
        return real(*args, **kwargs)
    return backward
