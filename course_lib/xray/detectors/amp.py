"""Detector: fp16 training (autocast, or fp16 weights) without a GradScaler, and its
gradients underflowing to zero (S3)."""

from __future__ import annotations

from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

MOSTLY_ZERO = 0.5  # a step whose gradient values are at least this fraction exactly 0.0


def _no_fp16(obs: RunEvents) -> str:
    if obs.of("fp16_params") or any(e["dtype"] == "float16" for _, e in obs.of("autocast")):
        return ""
    return "no fp16 autocast ran and no fp16 weights were trained"


@rule("S3", needs=("autocast", "fp16_params", "scaler_scale", "opt_step"), unjudged=_no_fp16)
def _s3(obs: RunEvents) -> Finding | None:
    """S3 on the first rank that trained under fp16 autocast without scaling its loss:
    confirmed when most steps' gradients were mostly exactly zero, else suspected."""
    for rank in sorted(obs.events):
        fp16 = [e for r, e in obs.of("autocast") if r == rank
                and e["dtype"] == "float16" and e["training"]]
        fp16 += [{**e, "device": "fp16 weights"} for r, e in obs.of("fp16_params")
                 if r == rank]
        scaled = [e for r, e in obs.of("scaler_scale") if r == rank]
        if not fp16 or scaled:
            continue
        steps = [e for r, e in obs.of("opt_step") if r == rank and e.get("values")]
        where = fp16[0]["where"]
        if not steps:
            return finding("S3", f"rank {rank} trained under fp16 autocast "
                                 f"({fp16[0]['device']}) without a GradScaler; no optimizer "
                                 f"step came to measure its gradients", where, "suspected")
        fractions = [e["zero"] / e["values"] for e in steps]
        zero_steps = sum(f >= MOSTLY_ZERO for f in fractions)
        all_zero = sum(e["max_abs"] == 0.0 for e in steps)
        low, high = f"{min(fractions):.0%}", f"{max(fractions):.0%}"
        span = low if low == high else f"{low}-{high}"
        how = "fp16 weights" if "fp16 weights" in fp16[0]["device"] else "fp16 autocast"
        evidence = (f"{how} without a GradScaler on rank {rank}: {span} of the "
                    f"gradient values were exactly 0.0 at the {len(steps)} optimizer steps "
                    f"measured")
        if all_zero:
            evidence += f" (max |grad| was exactly 0.0 at {all_zero} of them)"
        confirmed = all_zero or zero_steps * 2 >= len(steps)
        return finding("S3", evidence, where, "confirmed" if confirmed else "suspected")
    return None
