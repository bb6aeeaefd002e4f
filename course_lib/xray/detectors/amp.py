"""Detector: fp16 training (autocast, or fp16 weights) without a GradScaler, and its
gradients underflowing to zero (S3)."""

from __future__ import annotations

from course_lib.xray.events import Autocast, Fp16Params, OptStep, ScalerScale
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

MOSTLY_ZERO = 0.5  # a step whose gradient values are at least this fraction exactly 0.0


def _no_fp16(run: RunEvents) -> str:
    if run.of(Fp16Params) or any(e["dtype"] == "float16" for _, e in run.of(Autocast)):
        return ""
    return "no fp16 autocast ran and no fp16 weights were trained"


@rule("S3", needs=(Autocast, Fp16Params, ScalerScale, OptStep), unjudged=_no_fp16,
      absent="no rank trained in fp16 without a GradScaler scaling its loss")
def _s3(run: RunEvents) -> Finding | None:
    """S3 on the first rank that trained under fp16 autocast without scaling its loss:
    confirmed when most steps' gradients were mostly exactly zero, else suspected."""
    for rank in run.ranks:
        fp16 = [(e["where"], f"fp16 autocast ({e['device']})") for r, e in run.of(Autocast)
                if r == rank and e["dtype"] == "float16" and e["training"]]
        fp16 += [(e["where"], "fp16 weights") for r, e in run.of(Fp16Params) if r == rank]
        scaled = [e for r, e in run.of(ScalerScale) if r == rank]
        if not fp16 or scaled:
            continue
        steps = [e for r, e in run.of(OptStep) if r == rank and e.get("values")]
        where, how = fp16[0]
        if not steps:
            return finding("S3", f"rank {rank} trained with {how} without a GradScaler; no "
                                 f"optimizer step came to measure its gradients", where,
                           "suspected")
        fractions = [e.get("zero", 0) / e.get("values", 1) for e in steps]
        zero_steps = sum(f >= MOSTLY_ZERO for f in fractions)
        all_zero = sum(e.get("max_abs") == 0.0 for e in steps)
        low, high = f"{min(fractions):.0%}", f"{max(fractions):.0%}"
        span = low if low == high else f"{low}-{high}"
        evidence = (f"{how.split(' (')[0]} without a GradScaler on rank {rank}: {span} of the "
                    f"gradient values were exactly 0.0 at the {len(steps)} optimizer steps "
                    f"measured")
        if all_zero:
            evidence += f" (max |grad| was exactly 0.0 at {all_zero} of them)"
        confirmed = all_zero or zero_steps * 2 >= len(steps)
        return finding("S3", evidence, where, "confirmed" if confirmed else "suspected")
    return None
