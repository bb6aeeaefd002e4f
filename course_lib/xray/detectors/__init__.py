"""Detectors: each judges one area of an Observation and returns its Findings.

Each module has detect(obs) -> list[Finding], CHECKS (the ids it can judge) and optionally
not_checked(obs) -> list[str] ("P12: no checkpoint was saved").
"""

from __future__ import annotations

import importlib
from types import ModuleType

from course_lib.authoring.pitfalls import PITFALLS
from course_lib.xray.observation import Observation
from course_lib.xray.probes import FEEDS
from course_lib.xray.report import Report

DETECTORS = ["data", "output", "desync", "model", "checkpoint", "amp"]

# A finding that explains another's symptom: the second is left out when the first is there
# (uneven batches end in a hang that the desync report shows as ranks on different paths).
EXPLAINS = {"P20": {"S1"}}


def modules() -> list[ModuleType]:
    """The detector modules, in DETECTORS' order (one that fails to import is an error)."""
    return [importlib.import_module(f"course_lib.xray.detectors.{name}") for name in DETECTORS]


def _broken_probes(obs: Observation) -> dict[str, str]:
    """Each id a failed probe feeds, with why it could not be judged: a broken probe's
    missing events must never read as the learner's code doing something (or not)."""
    out: dict[str, str] = {}
    for rank, e in obs.of("probe_error"):
        for pid in FEEDS.get(e.get("probe", ""), ()):
            out.setdefault(pid, f"the x-ray's {e['probe']} probe failed on rank {rank} "
                                f"({e['error']})")
    return out


def run_all(obs: Observation, error_text: str = "", title: str = "X-ray") -> Report:
    """Every detector's findings on `obs`, with what was checked and what was not."""
    findings, not_checked, checks = [], [], []
    for module in modules():
        findings += module.detect(obs)
        checks += module.CHECKS
        if hasattr(module, "not_checked"):
            not_checked += module.not_checked(obs)
    broken = _broken_probes(obs)
    findings = [f for f in findings if f.id not in broken]
    not_checked += [f"{pid}: {why}" for pid, why in broken.items()]
    for rank, e in obs.of("probe_error"):
        if not FEEDS.get(e.get("probe", "")):
            not_checked.append(f"x-ray: a probe failed on rank {rank} ({e['error']}); what it "
                               "watches may be incomplete")
    ids = {f.id for f in findings}
    hidden = set().union(*(EXPLAINS.get(i, set()) for i in ids))
    findings = sorted((f for f in findings if f.id not in hidden), key=lambda f: not f.confirmed)
    findings = list({f.id: f for f in reversed(findings)}.values())[::-1]  # one per id
    unjudged = {line.split(":", 1)[0] for line in not_checked}
    checked = [f"{pid} {PITFALLS[pid].title}" for pid in dict.fromkeys(checks)
               if pid not in unjudged and pid not in ids]
    return Report(findings=findings, checked=checked, not_checked=not_checked,
                  error=error_text, title=title)
