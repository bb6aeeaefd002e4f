"""Checks for lesson 08's exercise: predict a DDP step's time on a simulated link, compared
with the step time the simulator measures on real ranks at two world sizes."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, run_check
from course_lib.checks.result import CheckResult
from course_lib.teach.interconnect import Link, simulated_link

# A slow link and a model whose all-reduce dominates the step: 0.13 M parameters (0.53 MB)
# at 0.2 Gbit/s with 4 ms a message take 29 ms on 2 ranks, 44 ms on 3; a step's compute
# here takes ~1-3 ms.
LINK = Link(gbit_per_s=0.2, latency_ms=4, name="check link")
WIDTH = 360
STEPS = 6
WORLD_SIZES = (2, 3)
INSTANT = Link(gbit_per_s=float("inf"), latency_ms=0, name="instant")
# A compute time at which no two known mistakes give the same answer at 2 or 3 ranks (the
# measured one may: latency once with compute = 12 ms is no compute at 3 ranks): the hint
# is chosen from the answer's prediction for it.
PROBE_S = 0.001
# Measured against predicted: sleeps are exact to ~0.1 ms, but on a loaded 2-core machine
# the compute measured on an instant link (passed to the learner) moves by a few ms from run
# to run. Known wrong formulas are caught first, exactly; this tolerance only guards against
# a formula of another shape.
RTOL, ATOL_S = 0.2, 0.004


def make_model() -> nn.Module:
    """The check's model: one Linear(WIDTH, WIDTH), WIDTH * (WIDTH + 1) fp32 parameters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Linear(WIDTH, WIDTH)


def n_params() -> int:
    return WIDTH * (WIDTH + 1)


def _median_step(model: nn.Module, steps: int) -> float:
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for _ in range(steps):
        x = torch.randn(32, WIDTH, generator=gen)
        start = time.perf_counter()
        model(x).square().mean().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _measure_on_rank(fn: Callable, link: Link) -> dict[str, Any]:
    """Compute time (the hook on an instant link: loopback and the hook's threads, no wait),
    then the step time on `link`, and fn's prediction."""
    plain = DDP(make_model(), bucket_cap_mb=100)
    plain.register_comm_hook(INSTANT, simulated_link)
    compute_s = _median_step(plain, STEPS)
    linked = DDP(make_model(), bucket_cap_mb=100)
    linked.register_comm_hook(link, simulated_link)
    measured = _median_step(linked, STEPS)
    n = dist.get_world_size()
    predicted = float(fn(compute_s, n_params(), n, link))
    probe = float(fn(PROBE_S, n_params(), n, link))
    return {"compute": compute_s, "measured": measured, "predicted": predicted, "probe": probe}


def _wrong_formulas(compute: float, n: int, link: Link) -> dict[str, float]:
    """What common mistakes predict, with the hint each deserves."""
    nbytes = 4 * n_params()
    bw = link.gbit_per_s * 1e9
    lat = 2 * (n - 1) * link.latency_ms / 1e3
    ring = 2 * (n - 1) / n
    return {
        "you counted the latency once: a ring all-reduce is 2(N-1) messages (N-1 to "
        "reduce-scatter, N-1 to all-gather), each paying it":
            compute + link.latency_ms / 1e3 + ring * nbytes * 8 / bw,
        "you left out the ring factor: each rank sends 2(N-1)/N of the bytes, not the bytes "
        "once": compute + lat + nbytes * 8 / bw,
        "you multiplied by N: a ring all-reduce sends 2(N-1)/N of the bytes per rank, which "
        "stays below 2 however many ranks": compute + lat + n * nbytes * 8 / bw,
        "you left out the link's latency (latency_ms is in milliseconds)":
            compute + ring * nbytes * 8 / bw,
        "you counted bits as bytes: gbit_per_s is in gigaBITS per second, a float32 is 4 "
        "bytes = 32 bits": compute + lat + ring * nbytes / bw,
        "you counted parameters as bytes: each fp32 parameter is 4 bytes":
            compute + lat + ring * n_params() * 8 / bw,
        "you left out the compute time: the all-reduce starts after the backward":
            lat + ring * nbytes * 8 / bw,
    }


def _true(compute: float, n: int, link: Link) -> float:
    return compute + link.seconds(4 * n_params(), n)


def _judge(results: list[dict[str, Any]], n: int, link: Link) -> str:
    got = results[0]
    measured, predicted, compute = got["measured"], got["predicted"], got["compute"]
    said = (f"on {n} ranks your prediction was {predicted * 1e3:.1f} ms a step, the simulator "
            f"measured {measured * 1e3:.1f} ms (compute {compute * 1e3:.1f} ms)")
    true = _true(PROBE_S, n, link)
    for hint, value in _wrong_formulas(PROBE_S, n, link).items():
        if _near(got["probe"], value) and not _near(value, true):
            raise Rejected(f"{said}: {hint}.")
    if abs(predicted - measured) <= ATOL_S + RTOL * measured:
        return f"{n} ranks: predicted {predicted * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms"
    if predicted > 10 * measured or predicted < measured / 10:
        raise Rejected(f"{said}: check the units: return seconds, latency_ms is in "
                       "milliseconds, gbit_per_s in gigabits per second.")
    raise Rejected(f"{said}. A step is compute + 2(N-1) x latency + 2(N-1)/N x bytes x 8 / "
                   "bandwidth.")


def _near(a: float, b: float) -> bool:
    """Equal up to rounding in the learner's arithmetic (not up to measurement noise)."""
    return abs(a - b) <= 1e-4 + 0.01 * abs(b)


def check_predict_step_time(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(compute_s, n_params, world_size, link) must predict the seconds of one DDP step
    (one bucket, fp32 gradients) on `link` within 20% + 4 ms of a real run's, at 2 and 3
    ranks."""
    def judge() -> str:
        lines = [_judge(results, n, LINK) for n, results in
                 at_world_sizes(_measure_on_rank, fn, WORLD_SIZES, (LINK,), timeout)]
        return (f"Your model predicts the simulated link ({LINK.gbit_per_s:g} Gbit/s, "
                f"{LINK.latency_ms:g} ms): " + "; ".join(lines) + ".")
    return run_check("check_predict_step_time", fn, judge)
