"""Real faults for lesson 11, injected from inside a launch: a rank SIGKILLed while a file is
half written (by a watcher, or from inside torch.save: `SaveSpy`), SIGTERM sent to every
rank's process group as torchrun sends it, and a per-process
memory limit under which a large allocation really fails."""

from __future__ import annotations

import io
import os
import resource
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

POLL_S = 0.0005


def every_rank_pid() -> list[int]:
    """Every rank's process id, in rank order, on every rank (a collective)."""
    pids: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    return pids


def kill_when_half_written(folder: str | os.PathLike, pid: int, size: int,
                           timeout: float = 30.0) -> threading.Thread:
    """Start a thread that SIGKILLs process `pid` as soon as a file in `folder` that is
    being written holds between a quarter and three quarters of `size` bytes: a crash in
    the middle of torch.save. The thread gives up after `timeout` seconds."""
    def watch() -> None:
        start, deadline = time.time(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in Path(folder).iterdir():
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                if stat.st_mtime >= start - 1 and size // 4 < stat.st_size < size * 3 // 4:
                    os.kill(pid, signal.SIGKILL)
                    return
            time.sleep(POLL_S)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def terminate_after(pids: list[int], seconds: float) -> threading.Timer:
    """In `seconds`, send SIGTERM to every process in `pids` and to the processes of its
    group, as torchrun's agent does before it stops a job (`os.killpg` on each worker it
    started with `start_new_session=True`: torch/distributed/elastic/multiprocessing/
    subprocess_handler/subprocess_handler.py), so DataLoader workers get it too. A process
    that does not lead its own group gets the signal alone (never its launcher's group)."""
    def send() -> None:
        for pid in pids:
            try:
                leads_group = os.getpgid(pid) == pid
            except ProcessLookupError:
                continue
            (os.killpg if leads_group else os.kill)(pid, signal.SIGTERM)

    timer = threading.Timer(seconds, send)
    timer.daemon = True
    timer.start()
    return timer


def address_space() -> int:
    """This process's virtual memory size in bytes (VmSize in /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status: memory limits need Linux")


def limit_memory(extra_bytes: int) -> int:
    """Cap this process's address space at what it uses now plus `extra_bytes` (what
    `ulimit -v` or a scheduler's per-worker limit does); returns the cap. An allocation
    beyond it fails for real, inside the allocator."""
    cap = address_space() + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.RLIM_INFINITY))
    return cap


class SaveSpy:
    """Within `with SaveSpy() as spy:`, this process's torch.save and os.replace/os.rename
    are watched: `spy.written` lists where each saved file ended up (after any rename), as
    absolute paths. Set `spy.delay` (seconds) to make each torch.save wait before it writes
    (a slow disk), or `spy.kill = True` to SIGKILL this process in the middle of the next
    torch.save, once half of its bytes are on disk."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.delay, self.kill = 0.0, False
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> SaveSpy:
        self._saved = {"save": torch.save, "replace": os.replace, "rename": os.rename}
        torch.save = torch.serialization.save = self._save
        os.replace, os.rename = self._renamer("replace"), self._renamer("rename")
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.save = torch.serialization.save = self._saved["save"]
        os.replace, os.rename = self._saved["replace"], self._saved["rename"]

    def _save(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        name = self._file_name(f)
        if name is None:  # into memory (torch pickles some objects this way): not a file
            self._saved["save"](obj, f, *args, **kwargs)
            return
        time.sleep(self.delay)
        if not self.kill:
            self._saved["save"](obj, f, *args, **kwargs)
            self.written.append(name)
            return
        buffer = io.BytesIO()
        self._saved["save"](obj, buffer, *args, **kwargs)
        half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(half)
                out.flush()
                os.fsync(out.fileno())
        else:
            f.write(half)
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _file_name(f: Any) -> str | None:
        """The absolute path torch.save(obj, f) writes to; None for an in-memory buffer."""
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
        return os.path.abspath(name) if isinstance(name, str) else None

    def _renamer(self, which: str) -> Any:
        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            self._saved[which](src, dst, *args, **kwargs)
            if isinstance(src, (str, os.PathLike)) and isinstance(dst, (str, os.PathLike)):
                old = os.path.abspath(os.fspath(src))
                self.written = [os.path.abspath(os.fspath(dst)) if w == old else w
                                for w in self.written]
        return rename
