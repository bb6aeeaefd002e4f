"""What the x-ray tells the learner, as text, HTML or JSON: the findings, the rules checked
and not found, the rules not judged and why, and the exit status.

Every rule appears once: as a Finding, as Checked, or as Unjudged with its reason.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from course_lib.pitfalls import PITFALLS

if TYPE_CHECKING:
    from course_lib.launching.errors import DistributedError
    from course_lib.launching.run import Run

# The exit status of `python -m course_lib xray` (Report.exit_status).
CLEAN, CONFIRMED, FAILED, NOT_JUDGED = 0, 1, 2, 3
STATUSES = {
    CLEAN: "no pitfall found (each rule checked, or not judged with its reason)",
    CONFIRMED: "a pitfall confirmed",
    FAILED: "the run failed or hung, and no confirmed pitfall explains it",
    NOT_JUDGED: "could not judge: the script did not train here (the first line says why "
                "and what to do)",
}


@dataclass(frozen=True)
class Finding:
    """One pitfall this run showed: id, its title, the evidence in one line with numbers
    from the run, the learner's file:line where the fix goes ("" when it cannot tell), the
    lesson to read."""

    id: str
    title: str
    evidence: str
    where: str
    lesson: str
    certainty: str = "confirmed"  # or "suspected"

    @property
    def confirmed(self) -> bool:
        return self.certainty == "confirmed"


@dataclass(frozen=True)
class Checked:
    """A rule judged on this run that found nothing: `absent` says what the run did not
    do, as precisely as the rule's condition ("no plain BatchNorm layer trained on 16 or
    fewer samples per rank")."""

    id: str
    absent: str

    def __str__(self) -> str:
        return f"{self.id} {self.absent}"


@dataclass(frozen=True)
class Unjudged:
    """A rule this run gave nothing to judge, and why ("no DataLoader was made"; "the run
    failed before it finished, so an absence proves nothing")."""

    id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.id}: {self.reason}"


def finding(pid: str, evidence: str, where: str = "", certainty: str = "confirmed") -> Finding:
    """A Finding for a registry id, its title and lesson filled in from the course's registry."""
    if certainty not in ("confirmed", "suspected"):
        raise ValueError(f"certainty must be 'confirmed' or 'suspected', not {certainty!r}")
    pitfall = PITFALLS[pid]
    return Finding(pid, pitfall.title, evidence, where, pitfall.notebook, certainty)


@dataclass
class Report:
    """Every finding of one run, what was checked, what was not judged and why; `cause`
    is why the script did not train here (the report's first line, xray/cause.py), `error`
    the failed run's root-cause-first error text ("" when the run succeeded)."""

    findings: list[Finding] = field(default_factory=list)
    checked: list[Checked] = field(default_factory=list)
    not_checked: list[Unjudged] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # the x-ray's own probe failures
    error: str = ""
    title: str = "X-ray"
    cause: str = ""
    run: Run | None = field(default=None, repr=False, compare=False)  # the launch's Run
    failure: DistributedError | None = field(default=None, repr=False, compare=False)

    @property
    def exit_status(self) -> int:
        """CONFIRMED (1) when a finding is confirmed; else NOT_JUDGED (3) when the script
        did not train here; else FAILED (2) when the run failed; else CLEAN (0)."""
        if any(f.confirmed for f in self.findings):
            return CONFIRMED
        if self.cause:
            return NOT_JUDGED
        return FAILED if self.error else CLEAN

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: findings as objects, checked as "ID what was not found", not
        checked as "ID: why", then the x-ray's own probe failures, the cause and the error
        when there are."""
        out: dict[str, Any] = {"findings": [asdict(f) for f in self.findings],
                               "checked": [str(c) for c in self.checked],
                               "not_checked": [str(u) for u in self.not_checked]}
        if self.incomplete:
            out["incomplete"] = self.incomplete
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
        failed = " The run failed (the error is at the end)." if self.error else ""
        if not n and self.cause:
            return f"{self.title}: nothing was judged.{failed}"
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
            lines += ["Not judged:", *(f"  {line}" for line in _by_reason(self.not_checked))]
        if self.incomplete:
            lines += ["Incomplete:", *(f"  {line}" for line in self.incomplete)]
        if self.error:
            lines += ["", "The run's error (root cause first):", self.error]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(str(self))}</pre>"


def _by_reason(unjudged: list[Unjudged]) -> list[str]:
    """"P03, P04, P20: no training loop over a DataLoader ran": one line per reason."""
    ids: dict[str, list[str]] = {}
    for u in unjudged:
        ids.setdefault(u.reason, []).append(u.id)
    return [f"{', '.join(pids)}: {reason}" for reason, pids in ids.items()]
