"""Finding and Report: what the x-ray tells the learner, as text, HTML or JSON."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from course_lib.pitfalls import PITFALLS


@dataclass(frozen=True)
class Finding:
    """One pitfall this run showed: id, its title, the evidence in one line with numbers
    from the run, the learner's file:line ("" when it cannot tell), the lesson to read."""

    id: str
    title: str
    evidence: str
    where: str
    lesson: str
    certainty: str = "confirmed"  # or "suspected"

    @property
    def confirmed(self) -> bool:
        return self.certainty == "confirmed"


def finding(pid: str, evidence: str, where: str = "", certainty: str = "confirmed") -> Finding:
    """A Finding for a registry id, its title and lesson filled in from the course's registry."""
    if certainty not in ("confirmed", "suspected"):
        raise ValueError(f"certainty must be 'confirmed' or 'suspected', not {certainty!r}")
    pitfall = PITFALLS[pid]
    return Finding(pid, pitfall.title, evidence, where, pitfall.notebook, certainty)


@dataclass
class Report:
    """Every finding of one run, what was checked and what could not be; `error` is the
    failed run's root-cause-first error text ("" when the run succeeded)."""

    findings: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    error: str = ""
    title: str = "X-ray"
    cause: str = ""  # why the script did not train here, and what to do (xray/cause.py)
    run: Any = field(default=None, repr=False, compare=False)  # the launch's Run
    failure: Any = field(default=None, repr=False, compare=False)  # its DistributedError

    @property
    def exit_status(self) -> int:
        """1 when a finding is confirmed; else 2 when the run failed or did not train;
        else 0."""
        if any(f.confirmed for f in self.findings):
            return 1
        return 2 if self.error or self.cause else 0

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.findings]

    def to_dict(self) -> dict:
        out = {"findings": [asdict(f) for f in self.findings], "checked": self.checked,
               "not_checked": self.not_checked}
        if self.error:
            out["error"] = self.error
        if self.cause:
            out["cause"] = self.cause
        return out

    def to_json(self) -> str:
        """The report as one JSON object (the CLI's --json)."""
        return json.dumps(self.to_dict(), indent=1)

    def headline(self) -> str:
        n = len(self.findings)
        failed = " The run failed (the error is below the findings)." if self.error else ""
        if not n and self.cause:
            return f"{self.title}: nothing could be checked.{failed}"
        if not n:
            return f"{self.title}: no pitfalls found.{failed}"
        return f"{self.title}: {n} pitfall{'s' if n > 1 else ''} found.{failed}"

    def __str__(self) -> str:
        lines = [self.cause, self.headline()] if self.cause else [self.headline()]
        for f in self.findings:
            lines += [f"  {f.id} {f.title}  [{f.certainty}]",
                      f"      evidence: {f.evidence}"]
            if f.where:
                lines.append(f"      where:    {f.where}")
            lines.append(f"      read:     {f.lesson}")
        if self.checked:
            lines += ["Checked, not found:", *(f"  {c}" for c in self.checked)]
        if self.not_checked:
            lines += ["Could not check:", *(f"  {c}" for c in self.not_checked)]
        if self.error:
            lines += ["", "The run's error (root cause first):", self.error]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"
