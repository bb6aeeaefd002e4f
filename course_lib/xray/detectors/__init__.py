"""Detectors: the rules (xray/rules.py), one area module each, judged over one run.

Importing an area module declares its rules; AREAS imports each once, so a module that
fails to import is an error, never a rule silently left out.
"""

from __future__ import annotations

from course_lib.xray.detectors import (
    amp,
    checkpoint,
    data,
    desync,
    evaluation,
    model,
    output,
    pipeline,
    tensor_parallel,
    tensor_parallel_steps,
)
from course_lib.xray.events import EVENTS, KIND_OF, ProbeError
from course_lib.xray.report import Checked, Finding, Report, Unjudged
from course_lib.xray.rules import RULES, Rule
from course_lib.xray.run_events import RunEvents

AREAS = (data, evaluation, output, desync, model, checkpoint, amp, tensor_parallel,
         tensor_parallel_steps, pipeline)  # the report's order


def in_report_order() -> list[Rule]:
    """Every rule, area by area in AREAS' order, each area's in the order declared (a rule
    declared outside these modules is a KeyError: it would never be judged)."""
    order = {area.__name__: i for i, area in enumerate(AREAS)}
    return sorted(RULES.values(), key=lambda r: order[r.judge.__module__])


def run_all(run: RunEvents, error_text: str = "", title: str = "X-ray",
            absence_proves_nothing: str = "", judge_nothing: str = "") -> Report:
    """Every rule judged on `run`: its findings, what was checked clean, and what was not
    judged and why. `absence_proves_nothing`: the reason every rule that found nothing is
    not judged (a run that failed before it finished), instead of checked; `judge_nothing`:
    the reason no rule is judged at all (a script that did not train here)."""
    if judge_nothing:
        return Report(not_checked=[Unjudged(r.id, judge_nothing) for r in in_report_order()],
                      incomplete=_unfed_probe_errors(run), error=error_text, title=title)
    verdicts = [r.verdict(run) for r in in_report_order()]
    found = {v.id for v in verdicts if isinstance(v, Finding)}
    hidden = {h: pid for pid in found for h in RULES[pid].hides}
    findings: list[Finding] = []
    checked: list[Checked] = []
    not_checked: list[Unjudged] = []
    for v in verdicts:
        if v.id in hidden and isinstance(v, Finding):
            not_checked.append(Unjudged(v.id, f"its symptom is explained by {hidden[v.id]}'s "
                                              "finding above"))
        elif isinstance(v, Finding):
            findings.append(v)
        elif isinstance(v, Checked) and not absence_proves_nothing:
            checked.append(v)
        elif isinstance(v, Checked):
            not_checked.append(Unjudged(v.id, absence_proves_nothing))
        else:
            not_checked.append(v)
    findings.sort(key=lambda f: not f.confirmed)
    return Report(findings=findings, checked=checked, not_checked=not_checked,
                  incomplete=_unfed_probe_errors(run), error=error_text, title=title)


def _unfed_probe_errors(run: RunEvents) -> list[str]:
    """A failed probe that no rule needs (the process and gpu probes, a bug outside any
    probe): what it watches may be incomplete."""
    needed = {EVENTS[KIND_OF[schema]].writer for r in RULES.values() for schema in r.needs}
    return [f"the x-ray's {e['probe'] or 'own'} probe failed on rank {rank} ({e['error']}); "
            "what it watches may be incomplete"
            for rank, e in run.of(ProbeError) if e["probe"] not in needed]
