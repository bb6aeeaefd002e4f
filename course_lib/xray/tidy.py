"""Take the x-ray's own frames out of a failed run's tracebacks, so the learner's show."""

from __future__ import annotations

import os
import re

_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<file>[^"]+)", line \d+')
_OURS = (os.sep + os.path.join("course_lib", "xray") + os.sep, "<frozen runpy>")


def tidy(text: str) -> str:
    """`text` without traceback frames from course_lib/xray (the probes, the script runner)
    and runpy: each such "File ..." line and its indented source lines go."""
    out, skip_deeper = [], None
    for line in text.splitlines():
        if skip_deeper is not None:
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent > skip_deeper:
                continue
            skip_deeper = None
        match = _FRAME.match(line)
        if match and any(o in match["file"] for o in _OURS):
            skip_deeper = len(match["indent"])
            continue
        out.append(line)
    return "\n".join(out)
