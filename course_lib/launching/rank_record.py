"""The rank record: what a rank knew, brought home even when the rank cannot send it.

A rank's collectors (course_lib.collectors) reach `Run.extras` by one channel, with three
doors: a snapshot sent with the rank's result or error; the same snapshot as last words
when the launcher stops the rank (written by this module's own signal thread, whether or
not the flight recorder is on); and the journal, values written as they are produced,
which outlives a rank killed by a signal. A failure to write is one "course_lib warning:"
line on the rank's stderr, never silent; the kernel keeps what it can read, name by name.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, BinaryIO

import cloudpickle

from course_lib import collectors
from course_lib.launching.payload import dumps

# Sent by the launcher to a rank it is about to stop; the rank answers with its last words
# (and its flight recorder's dump). A Python signal handler would not do: it runs only when
# the main thread is back in Python, and a hung rank's main thread is inside a collective.
# So the signal is blocked in every thread and one thread waits for it with sigwait.
STOP_SIGNAL = signal.SIGUSR2
WARNING = "course_lib warning:"


def journal_path(extras_path: str) -> str:
    """Where a rank journals, beside its last words."""
    return extras_path + ".journal"


def warn(text: str) -> None:
    """One warning line on this process's stderr (a rank's reaches its logs)."""
    print(f"{WARNING} {text}", file=sys.stderr, flush=True)


# -- the rank's side ---------------------------------------------------------------------------

def start(extras_path: str, then: Callable[[], None] | None = None) -> None:
    """Journal beside `extras_path`; on STOP_SIGNAL write last words to it, then call
    `then()` (the flight recorder's dump). Call before any other thread starts: threads
    inherit the blocked signal, so only the watcher ever receives it."""
    collectors.journal_to(_Journal(journal_path(extras_path)).write)
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
    os.register_at_fork(after_in_child=_in_child)
    threading.Thread(target=_answer_stops, args=(extras_path, then),
                     name="course_lib-rank-record", daemon=True).start()


def _in_child() -> None:
    """A DataLoader worker or any child: the signal back, and no journal (not its file)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
    collectors.journal_to(None)


def _answer_stops(extras_path: str, then: Callable[[], None] | None) -> None:
    while True:
        signal.sigwait({STOP_SIGNAL})
        write_last_words(extras_path)
        if then is not None:
            then()


def snapshot() -> bytes:
    """Every collector's data, each pickled apart: one that fails is left out with a
    warning line, and the others still go home."""
    data = {}
    for name, collect in collectors.registered().items():
        try:
            data[name] = dumps(collect())
        except Exception as exc:  # noqa: BLE001 - any failure: warn, the rest still go home
            warn(f"this rank's {name!r} data could not be sent back ({type(exc).__name__}: "
                 f"{exc}); Run.extras leaves it out.")
    return pickle.dumps(data)


def write_last_words(path: str) -> None:
    """Write snapshot() to `path` atomically for the launcher, which reads it once the rank
    is stopped. Runs in the signal thread while the main thread may be blocked."""
    try:
        data = snapshot()
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    except Exception as exc:  # noqa: BLE001 - a full disk, say: warn; the journal remains
        warn(f"this rank's last words could not be written ({type(exc).__name__}: {exc}); "
             "Run.extras holds only what it journaled.")


class _Journal:
    """Values appended to one file as they come, flushed: a signal cannot lose them."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: BinaryIO | None = None  # opened at the first value
        self.lock = threading.Lock()  # probes may note from DDP's hook threads
        self.failed: set[str] = set()  # names already warned about

    def write(self, name: str, value: Any) -> None:
        try:
            record = pickle.dumps((name, value))
            with self.lock:
                if self.file is None:
                    self.file = open(self.path, "ab")  # noqa: SIM115 - open for the rank's life
                self.file.write(record)
                self.file.flush()  # in the kernel's hands now
        except Exception as exc:  # noqa: BLE001 - any failure: warn once, keep journaling
            if name not in self.failed:
                self.failed.add(name)
                warn(f"a value of this rank's {name!r} could not be journaled "
                     f"({type(exc).__name__}: {exc}); if the rank dies, Run.extras lacks it.")


# -- the kernel's side -------------------------------------------------------------------------

def read(rank: int, sent: bytes | None, extras_path: str) -> dict[str, Any]:
    """Run.extras[rank]: per name, the snapshot the rank sent (or left as last words), else
    the list of values it journaled."""
    extras: dict[str, Any] = _journaled(rank, journal_path(extras_path))
    extras.update(_unpickled(rank, sent or _bytes(extras_path)))
    return extras


def _unpickled(rank: int, data: bytes | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in (pickle.loads(data) if data else {}).items():
        try:
            values[name] = cloudpickle.loads(value)
        except Exception as exc:  # noqa: BLE001 - a class unknown here: warn, keep the rest
            warn(f"rank {rank}'s {name!r} data could not be read back ({type(exc).__name__}: "
                 f"{exc}); Run.extras leaves it out.")
    return values


def _journaled(rank: int, path: str) -> dict[str, list[Any]]:
    """Each name's journaled values in order ({} when the rank journaled nothing)."""
    values: dict[str, list[Any]] = {}
    try:
        with open(path, "rb") as f:
            while True:
                name, value = pickle.load(f)
                values.setdefault(name, []).append(value)
    except (OSError, EOFError):
        pass  # no journal, or its end
    except Exception as exc:  # noqa: BLE001 - cut short by a kill, or a class unknown here
        warn(f"rank {rank}'s journal could not be read past {sum(map(len, values.values()))} "
             f"value(s) ({type(exc).__name__}: {exc}).")
    return values


def _bytes(path: str) -> bytes | None:
    """A file's bytes, None when there is none (a rank that left no last words)."""
    try:
        with open(path, "rb") as f:
            return f.read() or None
    except OSError:
        return None
