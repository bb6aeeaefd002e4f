"""Real faults for lesson 11, injected from inside a launch: a rank SIGKILLed while a file is
half written (by a watcher, or as `SaveSpy` leaves a save cut half-way), SIGTERM sent to every
rank's process group as torchrun sends it, and a per-process
memory limit under which a large allocation really fails."""

from __future__ import annotations

import json
import os
import resource
import shutil
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
    """Within `with SaveSpy() as spy:`, this process's torch.save, shutil.copyfile (and so
    shutil.copy, copy2), os.replace/os.rename and os.remove/os.unlink are watched.
    `spy.written` lists where each saved or copied file ended up (after any rename), as
    absolute paths; `spy.renames` every (source, target) renamed. Set `spy.delay` (seconds) to
    make each torch.save wait before it writes (a slow disk).

    A crash in the middle of a save: set `spy.kill = True`, let the save run, then call
    `spy.crash()`. It puts the files back as they were at the moment the save's most
    dangerous write was half done, and SIGKILLs this process. That write is the first copy
    (a copy rewrites its target in place), else the first torch.save whose file is still
    there when the save ends (written in place, never renamed), else the last torch.save (a
    temporary file, renamed later): what came after it is undone, and its file is cut to
    half its bytes."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.renames: list[tuple[str, str]] = []
        self.delay, self.kill = 0.0, False
        self._ops: list[dict[str, Any]] = []  # while kill is set: each write, rename, removal
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> SaveSpy:
        self._saved = {"save": torch.save, "replace": os.replace, "rename": os.rename,
                       "copyfile": shutil.copyfile, "remove": os.remove, "unlink": os.unlink}
        torch.save = torch.serialization.save = self._save
        os.replace, os.rename = self._renamer("replace"), self._renamer("rename")
        os.remove, os.unlink = self._remover("remove"), self._remover("unlink")
        shutil.copyfile = self._copyfile
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.save = torch.serialization.save = self._saved["save"]
        os.replace, os.rename = self._saved["replace"], self._saved["rename"]
        os.remove, os.unlink = self._saved["remove"], self._saved["unlink"]
        shutil.copyfile = self._saved["copyfile"]

    def _save(self, obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        name = self._file_name(f)
        if name is None:  # into memory (torch pickles some objects this way): not a file
            self._saved["save"](obj, f, *args, **kwargs)
            return
        time.sleep(self.delay)
        before = _contents(name) if self.kill else None
        self._saved["save"](obj, f, *args, **kwargs)
        self.written.append(name)
        if self.kill:
            self._ops.append({"kind": "write", "op": "torch.save", "target": name,
                              "before": before})

    def _copyfile(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        target = os.path.abspath(os.fspath(dst))
        before = _contents(target) if self.kill else None
        done = self._saved["copyfile"](src, dst, *args, **kwargs)
        self.written.append(target)
        if self.kill:
            self._ops.append({"kind": "write", "op": "shutil.copyfile", "target": target,
                              "before": before, "source": os.path.abspath(os.fspath(src))})
        return done

    def _renamer(self, which: str) -> Any:
        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if not (isinstance(src, (str, os.PathLike)) and isinstance(dst, (str, os.PathLike))):
                self._saved[which](src, dst, *args, **kwargs)  # file descriptors: not followed
                return
            old, new = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst))
            before = _contents(new) if self.kill else None
            self._saved[which](src, dst, *args, **kwargs)
            self.renames.append((old, new))
            self.written = [new if w == old else w for w in self.written]
            if self.kill:
                self._ops.append({"kind": "rename", "op": f"os.{which}", "source": old,
                                  "target": new, "before": before})
        return rename

    def _remover(self, which: str) -> Any:
        def remove(path: Any, *args: Any, **kwargs: Any) -> None:
            name = (os.path.abspath(os.fspath(path)) if isinstance(path, (str, os.PathLike))
                    else None)
            before = _contents(name) if name and self.kill else None
            self._saved[which](path, *args, **kwargs)
            if name and self.kill and before is not None:
                self._ops.append({"kind": "remove", "op": f"os.{which}", "target": name,
                                  "before": before})
        return remove

    def crash(self, report: str | os.PathLike | None = None) -> None:
        """Leave the files as a SIGKILL half-way through the save's most dangerous write
        would (see the class), write what that write was to `report` (JSON), and die."""
        writes = [i for i, op in enumerate(self._ops) if op["kind"] == "write"]
        copies = [i for i in writes if self._ops[i]["op"] == "shutil.copyfile"]
        kept = [i for i in writes if self._still_there(i)]
        chosen = next(iter(copies or kept or writes[-1:]), None)
        if chosen is not None:
            for op in reversed(self._ops[chosen + 1:]):
                self._undo(op)
            target = self._ops[chosen]["target"]
            whole = _contents(target)
            if whole is not None:  # else another rank writing this file moved it away
                _write(target, whole[: len(whole) // 2])
        if report is not None:
            op = self._ops[chosen] if chosen is not None else {}
            with open(report, "w") as f:
                json.dump({k: op.get(k) for k in ("op", "source", "target")}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    def _still_there(self, index: int) -> bool:
        """Whether the file written by op `index` is still where it was written at the end:
        not renamed away, removed or written over later."""
        target = self._ops[index]["target"]
        return not any(op.get("source") == target or op["target"] == target
                       for op in self._ops[index + 1:])

    def _undo(self, op: dict[str, Any]) -> None:
        """Put the files back as they were before `op`. Where ranks write one file, another
        rank's crash may have moved it already: what is gone is left gone."""
        try:
            if op["kind"] == "rename":
                self._saved["replace"](op["target"], op["source"])
            if op["before"] is not None:
                _write(op["target"], op["before"])
            elif op["kind"] == "write":
                self._saved["unlink"](op["target"])
        except FileNotFoundError:
            pass

    @staticmethod
    def _file_name(f: Any) -> str | None:
        """The absolute path torch.save(obj, f) writes to; None for an in-memory buffer."""
        name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
        return os.path.abspath(name) if isinstance(name, str) else None



def _contents(path: str | None) -> bytes | None:
    """A file's bytes, or None when there is no such file."""
    try:
        with open(path, "rb") as f:  # type: ignore[arg-type]
            return f.read()
    except (OSError, TypeError):
        return None


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
