"""How IPython shows the course's errors: the headline first, then what the error says,
then the line of the learner's cell that raised it; none of the course's own frames.

IPython (and so Jupyter) renders an exception that has `_render_traceback_()` with the lines
it returns instead of the usual traceback; scripts and pytest never call it, so there the
traceback stays complete. Error outputs keep their `ename` and `evalue`, which the gate reads.
"""

from __future__ import annotations

import functools
import os
import sysconfig
import traceback
from typing import TypeVar

from course_lib.launching.cells import name_cells

_COURSE_LIB = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_NOT_THE_LEARNERS = (_COURSE_LIB, sysconfig.get_paths()["stdlib"] + os.sep)
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

E = TypeVar("E", bound=BaseException)


def render(exc: BaseException) -> list[str]:
    """The lines IPython shows for `exc`: "Name: message" (every line of it), then where in
    the learner's code it was raised."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    frames = learner_frames(exc)
    if frames:
        lines += ["", "Raised from your code:",
                  *name_cells("".join(traceback.format_list(frames))).rstrip().splitlines()]
    return lines


def learner_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of `exc`'s traceback in the learner's code: not course_lib, the standard
    library, or an installed package (IPython's own frames among them)."""
    return [f for f in traceback.extract_tb(exc.__traceback__)
            if not f.filename.startswith(_NOT_THE_LEARNERS)
            and not any(p in f.filename for p in _PACKAGES)]


def headline_first(exc: E) -> E:
    """`exc`, shown by IPython from its message down, without the course's frames above it
    (for an error the course raises through its own code, e.g. a check's stub error)."""
    exc._render_traceback_ = functools.partial(render, exc)  # type: ignore[attr-defined]
    return exc
