"""Name a notebook cell's code as IPython does ("Cell In[4], line 5"), not by its temp file."""

from __future__ import annotations

import re

_FRAME_FILE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_PATH_LINE = re.compile(r"(?P<file>/[^\s:\"']+\.py):(?P<line>\d+)")


def _ipython_name(path: str) -> str | None:
    """'Cell In[4]' for a cell's compiled file name in this kernel; None elsewhere."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    named = shell.compile.format_code_name(path) if shell is not None and path else None
    return f"{named[0]} {named[1]}" if named else None


def cell_name(where: str) -> str:
    """'/tmp/ipykernel_7/123.py:5' -> 'Cell In[4], line 5' in a notebook; else unchanged."""
    path, _, line = where.rpartition(":")
    named = _ipython_name(path)
    return f"{named}, line {line}" if named else where


def name_cells(traceback_text: str) -> str:
    """In a traceback, 'File "/tmp/ipykernel_7/123.py", line 5' -> 'Cell In[4], line 5', as
    the kernel's own tracebacks show it; other frames unchanged."""

    def rename(match: re.Match[str]) -> str:
        named = _ipython_name(match["file"])
        return f"{named}, line {match['line']}" if named else match[0]

    return _FRAME_FILE.sub(rename, traceback_text)


def name_cell_paths(text: str) -> str:
    """In free text, '/tmp/ipykernel_7/123.py:5' -> 'Cell In[4], line 5' wherever the kernel
    knows the file as a cell; other paths unchanged."""
    return _PATH_LINE.sub(lambda m: cell_name(m[0]), text)
