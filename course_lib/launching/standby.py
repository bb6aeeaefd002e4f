"""Ready ranks: after a launch, the same ranks' successors are started in the background,
so that the next cell finds its processes up and their process group made.

Each set runs one function (fresh processes: fresh random state, nothing left from the
last cell). A launch that asks for another world size, backend, timeout or environment (the
kernel's own included: a variable set in a cell) stops them and starts its own. They start
only once the kernel has been idle for IDLE_S, so back-to-back launches (a check at two
world sizes, Run All) never pay for a set they would throw away. While they wait they use
no CPU; they end with the kernel (their pipe closes) or at its exit.
COURSE_READY_RANKS=0 turns them off, =1 on; by default they are on inside IPython only.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

from course_lib.launching import ranks
from course_lib.launching.ranks import RankKey, RankSet

IDLE_S = 0.3  # a person reads a cell's output for longer; Run All's next cell comes sooner

_lock = threading.Lock()
_ready: RankSet | None = None
_timer: threading.Timer | None = None


def enabled() -> bool:
    """Whether launches leave ready ranks behind (COURSE_READY_RANKS, else: in IPython)."""
    setting = os.environ.get("COURSE_READY_RANKS", "")
    if setting in ("0", "1"):
        return setting == "1"
    shell = sys.modules.get("IPython")
    return shell is not None and shell.get_ipython() is not None


def take(key: RankKey) -> RankSet | None:
    """The ready ranks if they were started for `key` and none has exited; any others are
    stopped. None when there are none to use. Every launch calls it (or discard) first."""
    global _ready
    _cancel_timer()
    ranks.collect_retired()  # the last launch's ranks: no start can race with it now
    with _lock:
        ready, _ready = _ready, None
    if ready is None:
        return None
    if ready.key == key and ready.all_running:
        return ready
    ranks.close(ready)
    return None


def after_launch(key: RankKey) -> None:
    """Start ranks for `key` once the kernel has been idle for IDLE_S (if enabled)."""
    global _timer
    if not enabled():
        return
    _cancel_timer()
    _timer = threading.Timer(IDLE_S, _prepare, args=(key,))
    _timer.name, _timer.daemon = "course_lib-ready-ranks", True
    _timer.start()


def discard() -> None:
    """Stop the ready ranks and any pending start, and collect the last launch's ranks
    (tests, the kernel's exit)."""
    global _ready
    _cancel_timer()
    ranks.collect_retired()
    with _lock:
        ready, _ready = _ready, None
    if ready is not None:
        ranks.close(ready)


def _prepare(key: RankKey) -> None:
    global _ready
    with _lock:
        if _ready is not None:
            return
        try:
            _ready = ranks.start(key)
        except Exception:  # noqa: BLE001 - the next launch starts its own and shows the error
            _ready = None


def _cancel_timer() -> None:
    """Cancel a pending start; wait for one under way (it only forks: milliseconds)."""
    global _timer
    timer, _timer = _timer, None
    if timer is not None:
        timer.cancel()
        if timer is not threading.current_thread():
            timer.join()


atexit.register(discard)
