"""A set of ranks for one launch: what it asks of them, their processes, their temporary
folder, and the pipe whose closing ends them (a dead kernel closes it too)."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from course_lib import network
from course_lib.launching import net
from course_lib.launching.forkserver import Worker, kill, reap, start_worker
from course_lib.launching.rank_main import WorkerSpec


@dataclass(frozen=True)
class RankKey:
    """What a launch asks of its ranks, the function aside: ranks started for one key can
    run any function launched with the same key. `env` holds every variable a rank gets
    (the kernel's environment included) but MASTER_PORT, which each set picks."""

    world_size: int
    backend: str
    pg_timeout: float
    env: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, world_size: int, backend: str, pg_timeout: float,
           env: dict[str, str]) -> RankKey:
        """The key of a launch: the kernel's environment now (as a torchrun worker inherits
        its shell's), then the course's defaults (one thread, sockets on loopback), then
        the launch's `env`. A MASTER_PORT left in the kernel by a tutorial is not used."""
        kernel = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
        full = {**kernel, "OMP_NUM_THREADS": "1", **net.loopback_env(),
                "MASTER_ADDR": "127.0.0.1", **env}
        return cls(world_size, backend, pg_timeout, tuple(sorted(full.items())))


@dataclass
class RankSet:
    """Started ranks: each sets up its process group, says "ready", and waits for the
    function that a launch sends it (launcher._Launch)."""

    key: RankKey
    workers: list[Worker]
    folder: tempfile.TemporaryDirectory[str]
    alive_w: int  # the kernel's end of the pipe each rank watches: closing it ends them
    started: float  # time.monotonic() when they were started

    @property
    def all_running(self) -> bool:
        """Whether no rank has exited (a set is used only whole)."""
        return all(w.process.exitcode is None for w in self.workers)


def start(key: RankKey) -> RankSet:
    """Fork the ranks of `key` from the forkserver; they set up in the background."""
    folder = tempfile.TemporaryDirectory(prefix="course_lib-")
    env = dict(key.env)
    env.setdefault("MASTER_PORT", str(network.free_port()))
    specs = [_spec(rank, key, env, folder.name) for rank in range(key.world_size)]
    alive_r, alive_w = os.pipe()
    alive = Connection(alive_r, writable=False)
    ranks = RankSet(key, [], folder, alive_w, time.monotonic())
    try:
        for spec in specs:
            ranks.workers.append(start_worker(spec, alive))
    except BaseException:
        close(ranks)
        raise
    finally:
        alive.close()
    return ranks


def close(ranks: RankSet) -> None:
    """Stop any rank still running, close the kernel's pipes and remove the folder."""
    for w in ranks.workers:
        if w.running:
            kill(w)
    for w in ranks.workers:
        if w.running:
            reap(w)
    close_pipes(ranks)
    ranks.folder.cleanup()


_retired: list[Worker] = []  # ranks in os._exit whose exit status is not collected yet


def retire(workers: list[Worker]) -> None:
    """Ranks that said all they will say: kill what they leave behind (DataLoader workers)
    now, and collect their exit status at the next launch or the kernel's exit
    (collect_retired), not now: the operating system's teardown of a forked torch process
    took 5.6-11.7 ms in a measurement on the 2-core machine, and the cell need not wait."""
    for w in workers:
        kill(w)
    _retired.extend(workers)


def collect_retired() -> None:
    """Collect the exit status of retired ranks (by now ended) and release their handles.
    In the kernel's main thread, while no ranks are being started (standby's timer joined)."""
    while _retired:
        w = _retired.pop()
        reap(w)
        if w.exitcode is not None:
            w.process.close()


def close_pipes(ranks: RankSet) -> None:
    """Close the kernel's ends of every rank's pipes; a rank still alive then ends itself."""
    for w in ranks.workers:
        for fd in (w.stdout_fd, w.stderr_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        w.messages.close()
        w.payload.close()
        if w.exitcode is not None:  # reaped (a retired rank is closed once collected)
            w.process.close()
    try:
        os.close(ranks.alive_w)
    except OSError:
        pass


def _spec(rank: int, key: RankKey, env: dict[str, str], folder: str) -> WorkerSpec:
    rank_env = {
        **env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "WORLD_SIZE": str(key.world_size), "LOCAL_WORLD_SIZE": str(key.world_size),
    }
    return WorkerSpec(
        rank=rank, world_size=key.world_size, backend=key.backend, pg_timeout=key.pg_timeout,
        threads=int(rank_env["OMP_NUM_THREADS"]), env=rank_env,
        store_path=os.path.join(folder, "store"), stack_path=os.path.join(folder, f"stack{rank}"),
        flight_path=(os.path.join(folder, f"flight{rank}")
                     if rank_env.get("TORCH_FR_BUFFER_SIZE") else ""),
        extras_path=os.path.join(folder, f"extras{rank}"),
    )
