"""The rule table: one Rule per pitfall id the x-ray judges, declared beside its judge.

    @rule("P18", needs=("loader",), unjudged=lambda obs: "" if obs.of("loader") else
          "no DataLoader was made")
    def _p18(obs: RunEvents) -> Finding | None: ...

`needs` names the event kinds the judge reads (xray/events.py): when a probe that writes one
of them failed in this run, the rule is not judged and says so. `unjudged` gives the rule's
own reason why a run had nothing to judge ("" when it had). `hides` names the ids whose
symptom this rule's finding explains (uneven batches end in a hang: P20 hides S1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_lib.pitfalls import PITFALLS
from course_lib.xray.events import EVENTS
from course_lib.xray.report import Finding
from course_lib.xray.run_events import RunEvents

Judge = Callable[[RunEvents], "Finding | None"]
Reason = Callable[[RunEvents], str]


def _always(obs: RunEvents) -> str:
    """The default reason: a run always gives this rule something to judge."""
    return ""


@dataclass(frozen=True)
class Rule:
    """One pitfall's judgement: its id, the event kinds it reads, the judge, why a run may
    leave it unjudged, and the ids its finding explains away."""

    id: str
    needs: tuple[str, ...]
    judge: Judge
    unjudged_because: Reason = _always
    hides: tuple[str, ...] = ()

    def broken_probe(self, obs: RunEvents) -> str:
        """Why a failed probe leaves this rule unjudged ("" when none that it needs failed):
        a probe's missing events must never read as the learner's code doing something."""
        writers = {EVENTS[kind].writer for kind in self.needs}
        for rank, e in obs.of("probe_error"):
            if e["probe"] in writers:
                return f"the x-ray's {e['probe']} probe failed on rank {rank} ({e['error']})"
        return ""


RULES: dict[str, Rule] = {}


def rule(pid: str, needs: tuple[str, ...], unjudged: Reason = _always,
         hides: tuple[str, ...] = ()) -> Callable[[Judge], Judge]:
    """Declare the decorated function as the judge of pitfall `pid` (see the module's doc).
    An id the registry does not know, a kind events.py does not know, or a second rule for
    one id fails here, at import."""
    unknown = [k for k in needs if k not in EVENTS]
    if pid not in PITFALLS or unknown or pid in RULES:
        raise ValueError(f"rule {pid}: " + (f"unknown event kinds {unknown}" if unknown else
                                            "a second rule for this id" if pid in RULES else
                                            "not an id of course_lib/pitfalls.py"))

    def register(judge: Judge) -> Judge:
        RULES[pid] = Rule(pid, tuple(needs), judge, unjudged, tuple(hides))
        return judge
    return register


def one_rank(obs: RunEvents) -> str:
    """The reason of every rule that compares ranks, on a run of one rank."""
    return "one rank only" if obs.world_size < 2 else ""
