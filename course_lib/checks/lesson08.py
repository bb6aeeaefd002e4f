"""Checks for lesson 08's exercise: predict a DDP step's time on a simulated link. The
simulated link waits exactly `Link.seconds`, so the prediction is judged exactly against that
formula at two world sizes and two compute times, never against a stopwatch (a measured step
moves by several ms on a loaded machine, and let wrong formulas pass). The measured step on
real ranks is printed with the verdict, as a demonstration."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check
from course_lib.teach.scaling_model import Link
from course_lib.teach.simulated_link import simulated_link

# A slow link and a model whose all-reduce dominates the step: 0.13 M parameters (0.53 MB)
# at 0.2 Gbit/s with 4 ms a message take 29 ms on 2 ranks, 44 ms on 3; a step's compute
# here takes ~1-3 ms.
LINK = Link(gbit_per_s=0.2, latency_ms=4, name="check link")
WIDTH = 360
STEPS = 6
WORLD_SIZES = (2, 3)
INSTANT = Link(gbit_per_s=float("inf"), latency_ms=0, name="instant")
# Compute times the learner's function is asked about, besides the measured one: a mistake
# is named only when its formula gives the answer's value at every probe and world size.
PROBES_S = (0.001, 0.05)


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
    the step time on `link`, the compute timed again after it (the two computes differ by
    this machine's timing noise), and fn's predictions for the first compute and the probes."""
    plain = DDP(make_model(), bucket_cap_mb=100)
    plain.register_comm_hook(INSTANT, simulated_link)
    _median_step(plain, STEPS)  # warm-up: the rank's first backwards are slower
    compute_s = _median_step(plain, STEPS)
    linked = DDP(make_model(), bucket_cap_mb=100)
    linked.register_comm_hook(link, simulated_link)
    measured = _median_step(linked, STEPS)
    again_s = _median_step(plain, STEPS)
    n = dist.get_world_size()
    asked = (compute_s, *PROBES_S)
    return {"compute": compute_s, "measured": measured, "compute_again": again_s,
            "said": {c: float(fn(c, n_params(), n, link)) for c in asked}}


def _wrong_formulas(compute: float, n: int, link: Link) -> dict[str, float]:
    """What common mistakes predict, with the hint each deserves."""
    nbytes = 4 * n_params()
    bits = nbytes * 8 / (link.gbit_per_s * 1e9)
    latency = link.latency_ms / 1e3
    lat = 2 * (n - 1) * latency
    ring = 2 * (n - 1) / n
    return {
        "you counted the latency once: a ring all-reduce is 2(N-1) messages (N-1 to "
        "reduce-scatter, N-1 to all-gather), each paying it":
            compute + latency + ring * bits,
        "you counted half the ring: (N-1) messages carrying (N-1)/N of the bytes is the "
        "reduce-scatter alone; the all-gather sends as many again":
            compute + (n - 1) * latency + (n - 1) / n * bits,
        "your bytes term is half the ring's: (N-1)/N of the bytes is the reduce-scatter "
        "alone; the all-gather sends as many again, 2(N-1)/N in all":
            compute + lat + (n - 1) / n * bits,
        "you left out the ring factor: each rank sends 2(N-1)/N of the bytes, not the bytes "
        "once": compute + lat + bits,
        "you multiplied the bytes by N: a ring all-reduce sends 2(N-1)/N of the bytes per "
        "rank, which stays below 2 however many ranks": compute + lat + n * bits,
        "you used a tree's cost (2 log2 N messages, twice the bytes): the simulated link "
        "is a ring, 2(N-1) messages of 1/N of the bytes":
            compute + 2 * math.log2(n) * latency + 2 * bits,
        "you used a tree's cost (2 ceil(log2 N) messages, twice the bytes): the simulated link "
        "is a ring, 2(N-1) messages of 1/N of the bytes":
            compute + 2 * math.ceil(math.log2(n)) * latency + 2 * bits,
        "you left out the link's latency (latency_ms is in milliseconds)":
            compute + ring * bits,
        "you counted 2N latencies: in each phase of the ring (reduce-scatter, then "
        "all-gather) a rank sends N-1 messages, not N, so 2(N-1) in all":
            compute + 2 * n * latency + ring * bits,
        "you took giga as 2**30: gbit_per_s counts 10**9 bits per second (network speeds "
        "are decimal; only memory sizes use 2**30)":
            compute + lat + ring * nbytes * 8 / (link.gbit_per_s * 2**30),
        "you counted bits as bytes: gbit_per_s is in gigaBITS per second, a float32 is 4 "
        "bytes = 32 bits": compute + lat + ring * bits / 8,
        "you counted parameters as bytes: each fp32 parameter is 4 bytes":
            compute + lat + ring * bits / 4,
        "you took the larger of compute and communication, as if they overlapped: with one "
        "bucket the all-reduce starts when backward ends, so the two add":
            max(compute, lat + ring * bits),
        "you left out the compute time: the all-reduce starts after the backward":
            lat + ring * bits,
        "your answer is the 2-rank time at every world size: use the world_size argument":
            compute + 2 * latency + bits,
    }


def _true(compute: float, n: int, link: Link) -> float:
    return compute + link.seconds(4 * n_params(), n)


def _judge(got: dict[int, dict[str, Any]], link: Link) -> str:
    """Every prediction against the link's formula; the hint names the mistake whose formula
    gives every one of the answer's values (at both world sizes and all computes)."""
    asked = [(n, c, said) for n, r in got.items() for c, said in r["said"].items()]
    off = [(n, c, said) for n, c, said in asked if not _near(said, _true(c, n, link))]
    if not off:
        shown = "; ".join(f"{n} ranks: predicted {r['said'][r['compute']] * 1e3:.1f} ms, "
                          f"the simulator measured {r['measured'] * 1e3:.1f} ms (the compute "
                          f"in it, timed before and after: {r['compute'] * 1e3:.1f} and "
                          f"{r['compute_again'] * 1e3:.1f} ms)" for n, r in got.items())
        return (f"Your formula gives the simulated link's time ({link.gbit_per_s:g} Gbit/s, "
                f"{link.latency_ms:g} ms a message) at {len(asked)} inputs. On real ranks, a "
                f"demonstration: {shown}. The prediction uses the compute timed before, in "
                "runs of its own; where the two computes differ, that is this machine's timing "
                "noise, and it moves the measured step as much.")
    n, c, said = off[0]
    lead = (f"on {n} ranks with compute_s = {c * 1e3:.1f} ms you predicted {said * 1e3:.2f} "
            f"ms; the simulated link gives {_true(c, n, link) * 1e3:.2f} ms")
    for hint in _wrong_formulas(0.0, 2, link):
        if all(_near(said, _wrong_formulas(c, n, link)[hint]) for n, c, said in asked):
            raise Rejected(f"{lead}: {hint}.")
    if said > 10 * _true(c, n, link) or said < _true(c, n, link) / 10:
        raise Rejected(f"{lead}: check the units: return seconds, latency_ms is in "
                       "milliseconds, gbit_per_s in gigabits per second.")
    raise Rejected(f"{lead}. Reread how a ring all-reduce spends its time: how many messages "
                   "each rank sends, how many bytes each carries, and what comes before it.")


def _near(a: float, b: float) -> bool:
    """Equal up to rounding in the learner's arithmetic (not up to measurement noise)."""
    return abs(a - b) <= 1e-6 + 1e-3 * abs(b)


@check
def check_predict_step_time(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(compute_s, n_params, world_size, link) must give the seconds of one DDP step (one
    bucket, fp32 gradients) on the simulated `link`, asked on real ranks at 2 and 3 ranks
    and judged against the link's own formula."""
    got = {n: results[0] for n, results in
           at_world_sizes(_measure_on_rank, fn, WORLD_SIZES, (LINK,), timeout)}
    return _judge(got, LINK)
