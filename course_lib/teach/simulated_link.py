"""A simulated interconnect for DDP on one machine: comm hooks that make real ranks pay what
a link would cost (teach/scaling_model.py: the same cost on paper).

    model.register_comm_hook(PRESETS["10 GbE"], simulated_link)   # DDP's average, on a link
    model.register_comm_hook(OnLink(link, powerSGD_hook, state), hook_on_link)  # any hook
    traffic(link)                                                 # what this rank sent

Each rank has one queue per link: a transfer starts when the previous one has left the link.
The real all-reduce still runs on loopback, so results are exactly those of DDP without the
hook; the link's time is added AFTER it, so a step on the link is the step on loopback plus
the link's time (on a shared CPU the loopback all-reduce is not free: it waits for ranks the
OS parked).

No `from __future__ import annotations`: DDP checks a comm hook's annotations at runtime.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from course_lib.teach.scaling_model import MB, Link

_REAL_ALL_REDUCE = dist.all_reduce  # the course's own all-reduces never go through a patch


class _LinkQueue:
    """One rank's queue on one link: each transfer's Future completes when the real
    all-reduce is done and the modelled link has then carried it. Each waits on its own
    thread, so that a hook's callback may issue and wait for the next all-reduce (PowerSGD)."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.calls = 0
        self.bytes = 0
        self.lock = threading.Lock()

    def send(self, seconds: float, nbytes: int, real: torch.futures.Future
             ) -> torch.futures.Future:
        """A Future with `real`'s value, completed `seconds` after both `real` and the
        previous transfer on this link are done."""
        self.calls += 1
        self.bytes += nbytes
        out: torch.futures.Future = torch.futures.Future()
        threading.Thread(target=self._deliver, args=(seconds, real, out), daemon=True,
                         name="simulated-link").start()
        return out

    def _deliver(self, seconds: float, real: torch.futures.Future,
                 out: torch.futures.Future) -> None:
        """Complete `out` with `real`'s value once the link has carried it, or with its error."""
        try:
            value = real.wait()
        except RuntimeError as err:  # the real all-reduce failed (gloo): pass its error on
            out.set_exception(err)
            return
        with self.lock:
            done_at = max(time.perf_counter(), self.free_at) + seconds
            self.free_at = done_at
        time.sleep(max(0.0, done_at - time.perf_counter()))
        out.set_result(value)


_QUEUES: dict[Link, _LinkQueue] = {}
_LOCK = threading.Lock()


def _queue(link: Link) -> _LinkQueue:
    with _LOCK:
        if link not in _QUEUES:
            _QUEUES[link] = _LinkQueue()
        return _QUEUES[link]


def _on_link(link: Link, tensor: torch.Tensor, real: torch.futures.Future
             ) -> torch.futures.Future:
    nbytes = tensor.numel() * tensor.element_size()
    return _queue(link).send(link.seconds(nbytes, dist.get_world_size()), nbytes, real)


def simulated_link(link: "Link | None",
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook: DDP's own average (divide by the world size, all-reduce), delivered
    when `link` would have carried the bucket (None: no link, as fast as loopback)."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    real = _REAL_ALL_REDUCE(tensor, async_op=True).get_future().then(_first)
    return real if link is None else _on_link(link, tensor, real)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    """The bucket a comm hook's Future must hold (the all-reduce's holds a list of it)."""
    return fut.value()[0]


def traffic(link: Link) -> dict[str, float]:
    """What this rank sent on `link` so far: all-reduces and megabytes (before the ring)."""
    q = _QUEUES.get(link)
    return {"calls": q.calls if q else 0, "mb": (q.bytes if q else 0) / MB}


# -- any comm hook on the link: PowerSGD, fp16 compression ------------------------------------

@dataclass
class OnLink:
    """State for hook_on_link: run `hook(state, bucket)` with its all-reduces on `link`."""

    link: "Link | None"
    hook: Callable
    state: Any = None


class _DelayedWork:
    """What dist.all_reduce(async_op=True) returns, its Future delayed by the link."""

    def __init__(self, future: torch.futures.Future) -> None:
        self._future = future

    def get_future(self) -> torch.futures.Future:
        return self._future

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()
        return True


_ROUTE: dict[str, Link] = {}
_IN_FLIGHT = [0]  # hook_on_link runs whose Future has not completed yet


def _all_reduce_on_link(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                        async_op: bool = False) -> Any:
    work = _REAL_ALL_REDUCE(tensor, op=op, group=group, async_op=True)
    delayed = _on_link(_ROUTE["link"], tensor, work.get_future())
    if async_op:
        return _DelayedWork(delayed)
    delayed.wait()
    return None


def hook_on_link(on: OnLink, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that runs `on.hook` (fp16_compress_hook, powerSGD_hook...) with every
    dist.all_reduce of this rank on `on.link`: the link carries what the hook really sends.
    torch.distributed.all_reduce is replaced from the hook's start until its Future completes
    (PowerSGD all-reduces again from its callbacks, after the hook has returned), then put
    back, so that the rank's own all-reduces between steps do not pay the link.
    simulated_link is not affected: it calls the real all-reduce."""
    if on.link is None:
        return on.hook(on.state, bucket)
    with _LOCK:
        _ROUTE["link"] = on.link
        _IN_FLIGHT[0] += 1
        dist.all_reduce = _all_reduce_on_link
    try:
        future = on.hook(on.state, bucket)
    except BaseException:
        _hook_done()
        raise
    return future.then(_value_then_done)


def _value_then_done(future: torch.futures.Future) -> torch.Tensor:
    try:
        return future.value()
    finally:
        _hook_done()


def _hook_done() -> None:
    """One hook_on_link run ended: the real all-reduce is back once none is in flight."""
    with _LOCK:
        _IN_FLIGHT[0] -= 1
        if _IN_FLIGHT[0] == 0:
            dist.all_reduce = _REAL_ALL_REDUCE
