"""Lesson 08's check accepts the worked solution and a differently written correct answer,
and rejects plausible wrong predictions, each with the hint that names the mistake."""

import math

import pytest
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson08 import check_predict_step_time

NOTEBOOK = "08_communication_scaling.ipynb"
FAST = 20  # seconds a launch: every answer here finishes well within it

judged = verdicts_for(NOTEBOOK, FAST)


def with_link_seconds(compute_s, n_params, world_size, link):
    return compute_s + link.seconds(4 * n_params, world_size)


def in_bits_first(compute_s, n_params, world_size, link):
    bits_per_rank = 32 * n_params * (world_size - 1) * 2 / world_size
    messages = 2 * (world_size - 1)
    return compute_s + messages * link.latency_ms * 1e-3 + bits_per_rank / link.gbit_per_s / 1e9


def latency_once(compute_s, n_params, world_size, link):
    ring = 2 * (world_size - 1) / world_size
    return compute_s + link.latency_ms / 1e3 + ring * 32 * n_params / (link.gbit_per_s * 1e9)


def _latency(world_size, link):
    return 2 * (world_size - 1) * link.latency_ms / 1e3


def no_ring(compute_s, n_params, world_size, link):
    return compute_s + _latency(world_size, link) + 4 * n_params * 8 / (link.gbit_per_s * 1e9)


def times_n(compute_s, n_params, world_size, link):
    return compute_s + _latency(world_size, link) + world_size * 32 * n_params / (
        link.gbit_per_s * 1e9)


def no_latency(compute_s, n_params, world_size, link):
    ring = 2 * (world_size - 1) / world_size
    return compute_s + ring * 32 * n_params / (link.gbit_per_s * 1e9)


def bytes_as_bits(compute_s, n_params, world_size, link):
    ring = 2 * (world_size - 1) / world_size
    return compute_s + _latency(world_size, link) + ring * 4 * n_params / (link.gbit_per_s * 1e9)


def no_compute(compute_s, n_params, world_size, link):
    ring = 2 * (world_size - 1) / world_size
    return _latency(world_size, link) + ring * 32 * n_params / (link.gbit_per_s * 1e9)


def reduce_scatter_bytes(compute_s, n_params, world_size, link):
    """2(N-1) latencies but (N-1)/N of the bytes: passed the stopwatch check 5 of 12 times."""
    half = (world_size - 1) / world_size
    return compute_s + _latency(world_size, link) + half * 32 * n_params / (link.gbit_per_s * 1e9)


def half_ring(compute_s, n_params, world_size, link):
    half = (world_size - 1) / world_size
    return compute_s + _latency(world_size, link) / 2 + half * 32 * n_params / (
        link.gbit_per_s * 1e9)


def overlapped(compute_s, n_params, world_size, link):
    return max(compute_s, no_compute(compute_s, n_params, world_size, link))


def tree(compute_s, n_params, world_size, link):
    messages = 2 * math.log2(world_size)
    return compute_s + messages * link.latency_ms / 1e3 + 2 * 32 * n_params / (
        link.gbit_per_s * 1e9)


def tree_whole_steps(compute_s, n_params, world_size, link):
    """A review's wrong answer: a tree with ceil(log2 N) levels."""
    messages = 2 * math.ceil(math.log2(world_size))
    return compute_s + messages * link.latency_ms / 1e3 + 2 * 32 * n_params / (
        link.gbit_per_s * 1e9)


def two_ranks_always(compute_s, n_params, world_size, link):
    return with_link_seconds(compute_s, n_params, 2, link)


def in_milliseconds(compute_s, n_params, world_size, link):
    return 1e3 * with_link_seconds(compute_s, n_params, world_size, link)


def two_phases(compute_s, n_params, world_size, link):
    """Correct, written otherwise (a review's answer): reduce-scatter and all-gather as two
    phases of N-1 messages of bytes/N each."""
    n = world_size
    per_message = link.latency_ms * 1e-3 + 4 * n_params * 8 / n / (link.gbit_per_s * 1e9)
    return compute_s + 2 * (n - 1) * per_message


def two_n_latencies(compute_s, n_params, world_size, link):
    """A review's wrong answer: every rank sends in each of N steps."""
    n = world_size
    return (compute_s + 2 * n * link.latency_ms / 1000
            + 2 * (n - 1) / n * 4 * n_params * 8 / (link.gbit_per_s * 1e9))


def gibibits(compute_s, n_params, world_size, link):
    """A review's wrong answer: giga taken as 2**30."""
    return (compute_s + _latency(world_size, link)
            + 2 * (world_size - 1) / world_size * 4 * n_params * 8 / (link.gbit_per_s * 2**30))


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
PREDICT_STEP_TIME = [
    (Solution("predict_step_time"), ACCEPTED),
    (with_link_seconds, ACCEPTED),
    (in_bits_first, ACCEPTED),
    (two_phases, ACCEPTED),
    (latency_once, "you counted the latency once"),
    (two_n_latencies, "you counted 2N latencies"),
    (no_ring, "you left out the ring factor"),
    (times_n, "you multiplied the bytes by N"),
    (no_latency, "you left out the link's latency"),
    (bytes_as_bits, "you counted bits as bytes"),
    (gibibits, "you took giga as 2**30"),
    (no_compute, "you left out the compute time"),
    (in_milliseconds, "check the units"),
    (reduce_scatter_bytes, "your bytes term is half the ring's"),
    (half_ring, "you counted half the ring"),
    (overlapped, "you took the larger of compute and communication"),
    (tree, "you used a tree's cost (2 log2 N messages"),
    (tree_whole_steps, "you used a tree's cost (2 ceil(log2 N) messages"),
    (two_ranks_always, "your answer is the 2-rank time at every world size"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_predict_step_time, PREDICT_STEP_TIME))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)


def test_the_pass_line_shows_the_compute_timed_twice(capsys):
    """The demonstration on a pass says that the compute was timed apart, twice (its noise)."""
    result = check_predict_step_time(with_link_seconds, timeout=FAST)
    assert result.passed
    assert "timed before and after" in result.message
