"""What a notebook cell carries for the authoring tools to read, in one place: the keys of
its `metadata.course`, the tag that lets it raise, the MIME types of what it displays, and
the message an exercise stub raises.

The writers (`observe()`, `CheckResult`, the exercise builder) and the readers (the gate,
the coverage table, the checks that recognise a stub) import these names from here and
nothing else from each other, so this module imports nothing: the authoring tools stay free
of torch.

    metadata: {"course": {"pitfall": "P03", "role": "broken" | "fixed" | "demo",
                          "symptom": {"error": "RuntimeError", "match": "fragment"}
                                   | {"observed": "same_samples"}},
              (a "match" may be a list where torch versions word the error differently:
               the pinned torch's fragment first, any one of them shown)
               "tags": ["raises-exception"]}
              {"course": {"exercise": "stub" | "check"}}
"""

from __future__ import annotations

from typing import Any

COURSE = "course"  # the cell metadata key everything below lives under
PITFALL, ROLE, SYMPTOM = "pitfall", "role", "symptom"
ROLES = ("broken", "fixed", "demo")
ERROR, MATCH, OBSERVED = "error", "match", "observed"  # the keys of a symptom

EXERCISE = "exercise"  # course.exercise: which part of an exercise a cell is
STUB, CHECK = "stub", "check"
# What an exercise stub raises (the builder writes it; `stub_message`). A check tells "not
# written yet" from any other NotImplementedError by this marker: torch raises that error too,
# e.g. for most ops on the meta device, and a finished answer must not be told to write its TODO.
STUB_MARKER = "TODO: finish"

RAISES = "raises-exception"  # the tag that lets a cell raise under Run All and nbmake

# What cells display for the gate to read back from the executed notebook.
OBSERVATION_MIME = "application/vnd.course.observation+json"  # observe(): name, value, detail
CHECK_MIME = "application/vnd.course.check+json"  # an exercise check: check, passed, message


def stub_message(what: str) -> str:
    """The message of the NotImplementedError a stub raises; `what` is "f()" or "this cell"."""
    return f"{STUB_MARKER} {what}, then run the check"


def course_meta(cell: Any) -> dict:
    """The cell's `course` metadata ({} when absent or malformed)."""
    meta = cell.get("metadata", {}).get(COURSE, {})
    return meta if isinstance(meta, dict) else {}


def tags(cell: Any) -> list[str]:
    """The cell's tags ([] when it has none)."""
    return cell.get("metadata", {}).get("tags", [])
