"""Detectors: the rules (xray/rules.py), one area module each, judged over one run.

Importing an area module declares its rules; AREAS imports each once, so a module that
fails to import is an error, never a rule silently left out.
"""

from __future__ import annotations

from course_lib.pitfalls import PITFALLS
from course_lib.xray.detectors import amp, checkpoint, data, desync, evaluation, model, output
from course_lib.xray.events import EVENTS
from course_lib.xray.report import Finding, Report
from course_lib.xray.rules import RULES, Rule
from course_lib.xray.run_events import RunEvents

AREAS = (data, evaluation, output, desync, model, checkpoint, amp)  # the report's order


def rules() -> list[Rule]:
    """Every rule, area by area in AREAS' order, each area's in the order declared (a rule
    declared outside these modules is a KeyError: it would never be judged)."""
    order = {area.__name__: i for i, area in enumerate(AREAS)}
    return sorted(RULES.values(), key=lambda r: order[r.judge.__module__])


def run_all(obs: RunEvents, error_text: str = "", title: str = "X-ray") -> Report:
    """Every rule judged on `obs`: its findings, what was checked clean, and what could not
    be checked (a probe it needs failed, or the rule's own reason)."""
    findings: list[Finding] = []
    not_checked: list[str] = []
    for r in rules():
        why = r.broken_probe(obs)
        found = None if why else r.judge(obs)
        if found is not None:
            findings.append(found)
            continue
        why = why or r.unjudged_because(obs)
        if why:
            not_checked.append(f"{r.id}: {why}")
    not_checked += _unfed_probe_errors(obs)
    ids = {f.id for f in findings}
    hidden = {h for pid in ids for h in RULES[pid].hides}
    findings = sorted((f for f in findings if f.id not in hidden), key=lambda f: not f.confirmed)
    unjudged = {line.split(":", 1)[0] for line in not_checked}
    checked = [f"{r.id} {PITFALLS[r.id].title}" for r in rules()
               if r.id not in unjudged and r.id not in ids]
    return Report(findings=findings, checked=checked, not_checked=not_checked,
                  error=error_text, title=title)


def _unfed_probe_errors(obs: RunEvents) -> list[str]:
    """A failed probe that no rule needs (the spawn probe, a bug outside any probe)."""
    needed = {EVENTS[kind].writer for r in RULES.values() for kind in r.needs}
    return [f"x-ray: a probe failed on rank {rank} ({e['error']}); what it watches may be "
            "incomplete" for rank, e in obs.of("probe_error") if e["probe"] not in needed]
