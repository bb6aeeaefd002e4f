"""Generated blocks in README.md (and other pages): text between two marker lines that a
command writes and a test compares, so that tables never go stale by hand."""

from __future__ import annotations


def replace_block(text: str, block: str, start: str, end: str) -> str:
    """`text` with what stands between the `start` and `end` markers replaced by `block`;
    ValueError naming the markers when they are missing."""
    head, found_start, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        raise ValueError(f"the page needs the lines {start} and {end} where the table goes")
    return f"{head}{start}\n{block}\n{end}{tail}"
