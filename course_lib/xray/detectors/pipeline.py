"""Detector: pipeline parallelism: fewer micro-batches than stages (PP1), micro-batch
gradients added up and never divided (PP5), and the loss read on a rank whose stage is not
the last (PP4), from the pipeline probe's schedules and steps."""

from __future__ import annotations

from course_lib.xray.cause import learner_frame
from course_lib.xray.events import PipelineSchedule, PipelineStep
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

# What reading an empty `losses` list raises: torch.stack([]), sum(l) / len(l), losses[-1].
EMPTY_LOSSES = ("stack expects a non-empty TensorList", "division by zero",
                "list index out of range")


def _no_step(run: RunEvents) -> str:
    return "" if run.of(PipelineStep) else "no pipeline schedule's step() ran"


# -- PP1 ----------------------------------------------------------------------------------------

@rule("PP1", needs=(PipelineSchedule, PipelineStep), unjudged=_no_step,
      absent="no GPipe schedule stepped with fewer micro-batches than pipeline stages")
def _pp1(run: RunEvents) -> Finding | None:
    """ScheduleGPipe (one stage per rank) with m < p: each rank idles (p - 1) / (m + p - 1)
    of every step, more than half. (Schedule1F1B refuses m < p itself.)"""
    stages = {(rank, e["schedule"]): e["stages"] for rank, e in run.of(PipelineStep)}
    for rank, e in run.of(PipelineSchedule):
        p, m = stages.get((rank, e["key"]), 0), e["n_microbatches"]
        if e["schedule"] != "ScheduleGPipe" or not 0 < m < p:
            continue
        return finding("PP1", f"{e['schedule']} ran {p} stages with n_microbatches={m}: by its "
                              f"schedule each rank idles (p - 1) / (m + p - 1) = {p - 1}/"
                              f"{m + p - 1} = {(p - 1) / (m + p - 1):.0%} of every step (the "
                              f"bubble, before any time in sends and receives); give "
                              f"it at least {p} micro-batches, better several times more "
                              f"({4 * p} would leave {(p - 1) / (4 * p + p - 1):.0%})",
                       e["where"])
    return None


# -- PP5 ----------------------------------------------------------------------------------------

@rule("PP5", needs=(PipelineSchedule, PipelineStep), unjudged=_no_step,
      absent="no pipeline schedule added up its micro-batches' gradients without dividing "
             "them (scale_grads=False with a torch loss that averages)")
def _pp5(run: RunEvents) -> Finding | None:
    """scale_grads=False with a loss that is a mean per micro-batch: the m gradients are
    summed into .grad and nothing divides them by m. (A loss of the learner's own that
    divides by m again, with scale_grads=True, is not visible here: it says no reduction.)"""
    stepped = {(rank, e["schedule"]) for rank, e in run.of(PipelineStep)}
    for rank, e in run.of(PipelineSchedule):
        m = e["n_microbatches"]
        if (rank, e["key"]) not in stepped or e["scale_grads"] or e["reduction"] != "mean" \
                or m < 2:
            continue
        return finding("PP5", f"{e['schedule']}(n_microbatches={m}, scale_grads=False) with "
                              f"loss_fn={e['loss']} (reduction='mean') stepped: each step adds "
                              f"the {m} micro-batches' mean-loss gradients into .grad and "
                              f"nothing divides them by {m}, so every gradient is {m} times "
                              f"the batch's; keep scale_grads=True (the default), or give a "
                              f"loss that divides by {m} itself", e["where"])
    return None


# -- PP4 ----------------------------------------------------------------------------------------

@rule("PP4", needs=(PipelineStep,), unjudged=_no_step,
      absent="no rank whose pipeline stage is not the last failed reading its empty losses "
             "after step()")
def _pp4(run: RunEvents) -> Finding | None:
    """A rank without the last stage failed as an empty `losses` list fails (torch.stack
    of nothing, a division by its length, its last item): the loss function runs, and the
    list fills, only on the last stage."""
    if run.error is None:
        return None
    steps = run.of(PipelineStep)
    last = sorted({r for r, e in steps if e["last"]})
    for f in run.error.failures:
        mine = [e for r, e in steps if r == f.rank]
        said = next((m for m in EMPTY_LOSSES if m in f.message), "")
        if f.kind != "exception" or not mine or any(e["last"] for e in mine) or not said:
            continue
        e = mine[-1]
        frame = learner_frame(f)
        if frame is not None and frame.source and "loss" not in frame.source.lower():
            continue  # a line that reads no loss failed for some other reason
        at = f" at {frame.where}" if frame else ""
        held = [s.get("losses") for r, s in steps if r in last[:1] and "losses" in s]
        got = f" (rank {last[0]}'s held {held[-1]})" if held and last else ""
        there = f"on rank {last[0]}" if last else "on the last stage"
        return finding("PP4", f"rank {f.rank} holds stage {e['stage']} of {e['stages']}, not "
                              f"the last, and raised {f.error_type or 'an error'}{at} "
                              f"({said!r}) after its step(): the loss function runs only on "
                              f"the last stage, so its losses list stays empty{got}; log "
                              f"{there}, or broadcast the loss from it first",
                       frame.where if frame else e["where"])
    return None
