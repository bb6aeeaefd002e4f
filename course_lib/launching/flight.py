"""The rank side of the desync report: dump PyTorch's flight recorder to a file.

With TORCH_FR_BUFFER_SIZE set before init_process_group, torch 2.13 records every gloo
collective (name, input sizes, sequence number, the Python frames that issued it). A rank
dumps it when the function returns or raises, and when the launcher sends SIGUSR2 (at a
timeout, or when another rank failed). A Python signal handler would not do for that: it
runs only when the main thread is back in Python, and a hung rank's main thread is inside
a gloo collective. So SIGUSR2 is blocked in every thread and one thread waits for it with
sigwait; that thread dumps while the main thread is still blocked (measured, see
docs/facts.md).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import torch

DUMP_SIGNAL = signal.SIGUSR2
BUFFER_SIZE = "256"  # collectives kept per rank; the report shows the last few


def enabled() -> bool:
    """True when this process records collectives (the variable is read at group creation)."""
    return bool(os.environ.get("TORCH_FR_BUFFER_SIZE"))


def watch(path: str, before: Callable[[], None] | None = None) -> None:
    """Dump to `path` whenever DUMP_SIGNAL arrives, after calling `before()` (the rank's
    last words: the launcher waits for the dump, so what `before` writes is there by then).
    Call before any other thread starts: threads inherit the blocked signal, so only the
    watcher ever receives it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {DUMP_SIGNAL})
    os.register_at_fork(  # a DataLoader worker or any child gets the signal back
        after_in_child=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {DUMP_SIGNAL}))

    def wait_and_dump() -> None:
        while True:
            signal.sigwait({DUMP_SIGNAL})
            if before is not None:
                before()
            dump(path)

    threading.Thread(target=wait_and_dump, name="course_lib-flight-recorder",
                     daemon=True).start()


def dump(path: str) -> None:
    """Write the recorder's pickled trace to `path` atomically (the kernel unpickles it
    only when the launch fails). Never raises: the report is a help, not the result."""
    try:
        data = torch._C._distributed_c10d._dump_fr_trace()
        tmp = f"{path}.{threading.get_ident()}.tmp"  # the watcher and the main thread apart
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - no group yet, or a full disk: the report says "no dump"
        pass
