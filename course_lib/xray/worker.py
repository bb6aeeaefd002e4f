"""The rank side of the x-ray: install the probes, then run the learner's code."""

from __future__ import annotations

import os
import pickle
import runpy
import sys
from collections.abc import Callable
from typing import Any

from course_lib.collectors import register_collector
from course_lib.launching import flight
from course_lib.xray import record
from course_lib.xray.probes import install_all


def observed(spill_dir: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run fn(*args, **kwargs) in this rank with every probe installed; the events go home
    with the rank's result, or with its error. A rank the launcher stops (a hang, a peer's
    failure) sends neither: it writes them to `spill_dir` when asked for its flight recorder."""
    record.clear()
    register_collector("xray", record.events)
    _spill_with_flight_dump(spill_dir)
    install_all()
    return fn(*args, **kwargs)


def _spill_with_flight_dump(spill_dir: str) -> None:
    """Write this rank's events to spill_dir/rank<N>.pkl whenever its flight recorder is
    dumped (the launcher asks a rank it stops for that, from a thread that runs even while
    the main thread is blocked in a collective)."""
    real_dump = flight.dump
    path = os.path.join(spill_dir, f"rank{os.environ.get('RANK', '0')}.pkl")

    def dump(flight_path: str) -> None:
        real_dump(flight_path)
        try:
            data = pickle.dumps(list(record.events()))
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001 - events changing under us, a full disk: none then
            pass

    flight.dump = dump


def spilled(spill_dir: str, rank: int) -> list[dict[str, Any]] | None:
    """The events a stopped rank wrote (None when it wrote none)."""
    try:
        with open(os.path.join(spill_dir, f"rank{rank}.pkl"), "rb") as f:
            return pickle.loads(f.read())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None


def run_script(path: str, argv: list[str], cwd: str = "") -> None:
    """Run a torchrun-style script as `python path argv...` would, in this rank, in `cwd`
    (the caller's folder: a reused worker may have started elsewhere)."""
    if cwd:
        os.chdir(cwd)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")
