"""Let code that sets up its own process group run unchanged on the launch's ranks.

PyTorch's tutorials and every torchrun script call `dist.init_process_group(...)` themselves
(often after setting MASTER_ADDR and MASTER_PORT), and `destroy_process_group()` at the end.
Under `launch` the ranks have already met on a private, loopback-only rendezvous, so inside
a rank the first call keeps this group, or re-creates it with the backend the code asks for,
and says once (on rank 0) what it did. The second leaves the default group to the rank's
end, where the launcher exits without running destructors: the tutorial's order (destroy,
then its DDP model goes out of scope) hung 3 of 6 launches and aborts gloo ranks under
mp.spawn now and then (docs/facts.md).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course_lib import devices

real_init_process_group = c10d.init_process_group
real_destroy_process_group = c10d.destroy_process_group


class _LaunchGroup:
    """What the launcher set up, against which the learner's call is checked."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: float):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout = timedelta(seconds=timeout)
        self.inits = 0


_group: _LaunchGroup | None = None


def install(store: dist.Store, rank: int, world_size: int, timeout: float) -> None:
    """Route this rank's init_process_group calls to the launch's rendezvous."""
    global _group
    _group = _LaunchGroup(store, rank, world_size, timeout)
    # a drop-in that takes torch's arguments (its stub's signature differs in form only)
    dist.init_process_group = c10d.init_process_group = init_process_group  # type: ignore[assignment]
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group


def init_process_group(backend: Any = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, **options: Any) -> None:
    """dist.init_process_group as seen inside a launch: same arguments, the launch's ranks."""
    assert _group is not None
    _check("world_size", world_size, _group.world_size)
    _check("rank", rank, _group.rank)
    wanted = str(backend).lower() if backend is not None else None
    if dist.is_initialized() and wanted in (None, dist.get_backend()):
        _note(f"kept the launch's process group ({dist.get_backend()}, {_group.world_size} "
              "ranks); your MASTER_ADDR, MASTER_PORT and init_method are not used")
        return
    gpus = devices.visible_gpus()
    if wanted == "nccl" and devices.backend_for(_group.world_size, gpus) != "nccl":
        raise RuntimeError(
            f"this code asks for the NCCL backend, which needs one GPU per rank: "
            f"{_group.world_size} ranks, {gpus} GPU(s) here. On the CPU, "
            'use dist.init_process_group("gloo") (or no backend argument).')
    if dist.is_initialized():
        real_destroy_process_group()
    _group.inits += 1
    real_init_process_group(wanted, store=dist.PrefixStore(f"own_init{_group.inits}", _group.store),
               rank=_group.rank, world_size=_group.world_size,
               timeout=timeout or _group.timeout, **options)
    _note(f"started a {dist.get_backend()} process group on the launch's ranks; your "
          "MASTER_ADDR, MASTER_PORT and init_method are not used")


def destroy_process_group(group: Any = None) -> None:
    """dist.destroy_process_group as seen inside a launch: a group the code made itself goes
    at once; the default group stays until the rank ends (see the module's docstring)."""
    if group is not None and group is not dist.group.WORLD:
        real_destroy_process_group(group)


def _check(name: str, asked: int, launched: int) -> None:
    if asked in (-1, None) or int(asked) == launched:
        return
    if name == "world_size":
        fix = (f"launch with world_size={asked}, or pass int(os.environ['WORLD_SIZE']) as "
               "torchrun sets it")
    else:  # launch gives every rank the same args, unlike mp.spawn's rank argument
        fix = ("read the rank inside the function, int(os.environ['RANK']) as torchrun "
               "sets it, instead of passing it in args")
    raise ValueError(f"init_process_group({name}={asked}) on a rank whose launch has "
                     f"{name}={launched}: {fix}.")


def _note(text: str) -> None:
    if _group is not None and _group.rank == 0:
        print(f"course_lib: init_process_group() {text}.", flush=True)
