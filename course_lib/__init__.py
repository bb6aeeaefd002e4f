"""course_lib: run, watch and check real DDP workers from a Jupyter notebook.

`from course_lib import launch` works as always, but each name is imported on first use
(PEP 562), so that tools which never launch (the gate, the exercise builder) and
`import course_lib.<anything>` do not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for editors and type checkers; `x as x` marks a re-export (PEP 484)
    from course_lib.launching import DistributedError as DistributedError
    from course_lib.launching import Run as Run
    from course_lib.launching import launch as launch
    from course_lib.launching.devices import rank_device as rank_device
    from course_lib.teach.observe import observe as observe

# public name -> the module that defines it
_HOMES = {
    "launch": "course_lib.launching",
    "DistributedError": "course_lib.launching",
    "Run": "course_lib.launching",
    "rank_device": "course_lib.launching.devices",
    "observe": "course_lib.teach.observe",
}  # the x-ray: `from course_lib.xray import xray` (course_lib.xray is its package)

__all__ = list(_HOMES)  # one list: a new public name goes into _HOMES only


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used."""
    if name not in _HOMES:
        raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    if name == "launch":
        _warm_up()
    return value


def _warm_up() -> None:
    """Start the workers' forkserver in the background: the first launch then waits less."""
    from course_lib.launching.forkserver import warm_up

    warm_up()


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext course_lib` registers the %%ddp cell magic."""
    from course_lib.launching.magic import DDPMagics

    ipython.register_magics(DDPMagics)
    _warm_up()
