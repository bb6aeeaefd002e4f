"""The rule table: one Rule per pitfall id the x-ray judges, declared beside its judge.

    @rule("P18", needs=(Loader,), absent="no DataLoader with shuffle=True and a sampler",
          unjudged=lambda run: "" if run.of(Loader) else "no DataLoader was made")
    def _p18(run: RunEvents) -> Finding | None: ...

`needs` names the event schemas the judge reads (xray/events.py); the judge and `unjudged`
see the run through `run.only(needs)`, so reading another kind raises, and when a probe
that writes one of them failed in this run, the rule is not judged and says so. `absent`
is the "checked, not found" line, true to the rule's condition. `unjudged` gives the rule's
own reason why a run had nothing to judge ("" when it had). `hides` names the ids whose
symptom this rule's finding explains (uneven batches end in a hang: P20 hides S1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from course_lib.pitfalls import PITFALLS
from course_lib.xray.events import EVENTS, KIND_OF, Event, ProbeError
from course_lib.xray.report import Checked, Finding, Unjudged
from course_lib.xray.run_events import RunEvents

Judge = Callable[[RunEvents], "Finding | None"]
Reason = Callable[[RunEvents], str]


def _always(run: RunEvents) -> str:
    """The default reason: a run always gives this rule something to judge."""
    return ""


@dataclass(frozen=True)
class Rule:
    """One pitfall's judgement: its id, the event schemas it reads, the judge, what "not
    found" means, why a run may leave it unjudged, and the ids its finding explains away."""

    id: str
    needs: tuple[type[Event], ...]
    judge: Judge
    absent: str
    unjudged: Reason = _always
    hides: tuple[str, ...] = ()

    def verdict(self, run: RunEvents) -> Finding | Checked | Unjudged:
        """Judge this rule on its view of the run: a finding, checked clean, or not judged
        (a probe it needs failed, or the rule's own reason)."""
        broken = self.broken_probe(run)
        if broken:
            return Unjudged(self.id, broken)
        view = run.only(self.needs)
        found = self.judge(view)
        if found is not None:
            return found
        why = self.unjudged(view)
        return Unjudged(self.id, why) if why else Checked(self.id, self.absent)

    def broken_probe(self, run: RunEvents) -> str:
        """Why a failed probe leaves this rule unjudged ("" when none that it needs failed):
        a probe's missing events must never read as the learner's code doing something."""
        writers = {EVENTS[KIND_OF[schema]].writer for schema in self.needs}
        for rank, e in run.of(ProbeError):
            if e["probe"] in writers:
                if e["installing"]:
                    return (f"the x-ray's {e['probe']} probe could not be installed on this "
                            f"torch ({e['error']})")
                return f"the x-ray's {e['probe']} probe failed on rank {rank} ({e['error']})"
        return ""


RULES: dict[str, Rule] = {}


def rule(pid: str, needs: tuple[type[Event], ...], absent: str, unjudged: Reason = _always,
         hides: tuple[str, ...] = ()) -> Callable[[Judge], Judge]:
    """Declare the decorated function as the judge of pitfall `pid` (see the module's doc).
    An id the registry does not know, a schema events.py does not list (or the x-ray's own
    ProbeError), no `absent` text, or a second rule for one id fails here, at import."""
    unknown = [s.__name__ for s in needs if s not in KIND_OF or s is ProbeError]
    problem = ("not an id of course_lib/pitfalls.py" if pid not in PITFALLS else
               f"unknown event schemas {unknown}" if unknown else
               "needs no event schema" if not needs else
               "no 'absent' text" if not absent.strip() else
               "a second rule for this id" if pid in RULES else "")
    if problem:
        raise ValueError(f"rule {pid}: {problem}")

    def register(judge: Judge) -> Judge:
        RULES[pid] = Rule(pid, tuple(needs), judge, absent, unjudged, tuple(hides))
        return judge
    return register


def one_rank(run: RunEvents) -> str:
    """The reason of every rule that compares ranks, on a run of one rank."""
    return "one rank only" if run.world_size < 2 else ""
