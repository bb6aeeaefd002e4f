"""The board's state: one entry per learner and check, built from the verdicts the kernels
post, and what the instructor reads from it (the rows, who is stuck, each check's most
common hint). In memory, written through to an optional JSON file: a restarted service
reloads that file, and without one it starts empty."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

STUCK_FAILURES = 3  # failed attempts without a pass
STUCK_SECONDS = 600.0  # since the first attempt, without a pass


@dataclass
class Entry:
    """One learner's attempts at one check."""

    learner: str
    exercise: str
    check: str
    passed: bool = False  # the latest verdict
    kind: str = ""  # the latest verdict's kind ("pass" or the hint's kind)
    attempts: int = 0
    failures: int = 0
    first: float = 0.0  # epoch seconds, the service's clock
    last: float = 0.0
    passed_at: float | None = None  # the first pass
    hints: dict[str, int] = field(default_factory=dict)  # hint kind -> failed attempts

    def stuck(self, now: float) -> str:
        """Why this learner counts as stuck on this check ("" when not, and once it passed)."""
        if self.passed_at is not None:
            return ""
        if self.failures >= STUCK_FAILURES:
            return f"{self.failures} failed attempts"
        if now - self.first >= STUCK_SECONDS:
            return f"{(now - self.first) / 60:.0f} min without a pass"
        return ""


class Board:
    """Every entry, keyed by (learner, exercise, check); saved to `path` after each verdict."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.entries: dict[tuple[str, str, str], Entry] = {}
        if path is not None and path.exists():
            for row in json.loads(path.read_text())["entries"]:
                entry = Entry(**row)
                self.entries[(entry.learner, entry.exercise, entry.check)] = entry

    def record(self, learner: str, exercise: str, check: str, passed: bool, kind: str,
               now: float | None = None) -> Entry:
        """Count one verdict; `learner` comes from the token, never from the request body."""
        now = time.time() if now is None else now
        entry = self.entries.setdefault((learner, exercise, check),
                                        Entry(learner, exercise, check, first=now))
        entry.attempts += 1
        entry.passed, entry.kind, entry.last = passed, kind, now
        if passed:
            entry.passed_at = entry.passed_at or now
        else:
            entry.failures += 1
            entry.hints[kind] = entry.hints.get(kind, 0) + 1
        self.save()
        return entry

    def save(self) -> None:
        if self.path is None:
            return
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"entries": [asdict(e) for e in self.entries.values()]}))
        os.replace(temporary, self.path)

    def view(self, now: float | None = None) -> dict:
        """What the instructor reads (the page and the JSON endpoint show the same)."""
        now = time.time() if now is None else now
        entries = sorted(self.entries.values(), key=lambda e: (e.learner, e.exercise, e.check))
        rows = [{**asdict(e), "stuck": e.stuck(now)} for e in entries]
        return {"now": now, "stuck_rule": {"failures": STUCK_FAILURES, "seconds": STUCK_SECONDS},
                "learners": sorted({e.learner for e in entries}),
                "checks": self._checks(entries), "rows": rows,
                "stuck": [{k: r[k] for k in ("learner", "exercise", "check", "stuck")}
                          for r in rows if r["stuck"]]}

    @staticmethod
    def _checks(entries: list[Entry]) -> list[dict]:
        """Per check: how many learners tried and passed, and its most common hint (by
        learners who got it, then by attempts)."""
        out = []
        for exercise, check in sorted({(e.exercise, e.check) for e in entries}):
            mine = [e for e in entries if (e.exercise, e.check) == (exercise, check)]
            learners = Counter(k for e in mine for k in e.hints)
            attempts = Counter({k: sum(e.hints.get(k, 0) for e in mine) for k in learners})
            top = max(learners, key=lambda k: (learners[k], attempts[k]), default="")
            out.append({"exercise": exercise, "check": check, "tried": len(mine),
                        "passed": sum(e.passed_at is not None for e in mine),
                        "top_hint": top, "top_hint_learners": learners.get(top, 0),
                        "top_hint_attempts": attempts.get(top, 0)})
        return out
