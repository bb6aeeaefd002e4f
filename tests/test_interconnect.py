"""The simulated interconnect: its cost model, its results unchanged, its wait, any hook on it."""

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.network import network_interfaces
from course_lib.teach.scaling_model import PRESETS, Link, crossover, efficiency, predict_step
from course_lib.teach.simulated_link import OnLink, hook_on_link, simulated_link, traffic


def test_ring_cost_is_two_n_minus_one_latencies_plus_two_n_minus_one_over_n_of_the_bytes():
    link = Link(gbit_per_s=8, latency_ms=1)  # 1 GB/s
    assert link.seconds(10**9, 1) == 0.0
    assert link.seconds(10**9, 2) == pytest.approx(2 * 0.001 + 1.0)
    assert link.seconds(10**9, 4) == pytest.approx(6 * 0.001 + 1.5)
    assert predict_step(0.5, 10**9, 4, link, calls=2) == pytest.approx(0.5 + 0.012 + 1.5)
    assert efficiency(0.5, 2.0) == 0.25
    assert PRESETS["10 GbE"].gbit_per_s == 10


def test_crossover_is_where_one_all_reduce_outlasts_the_compute():
    slow = Link(gbit_per_s=8, latency_ms=1)  # 1 GB/s: 1 MB takes 1 ms on 2 ranks
    assert crossover(0.0005, 10**6, slow) == 2  # dominated from the first pair of ranks
    # latency-bound: 10 bytes, 2(N-1) ms of latency reach 10 ms at N = 6
    assert crossover(0.010, 10, slow) == 6
    # bandwidth-bound: 2(N-1)/N of 1 GB stays under 2 s, plus at most 126 ms of latency
    assert crossover(3.0, 10**9, slow) is None
    assert crossover(0.001, 0, Link(gbit_per_s=float("inf"), latency_ms=0)) is None


def test_bad_link_or_calls_are_refused():
    with pytest.raises(ValueError, match="gbit_per_s > 0"):
        Link(gbit_per_s=0)
    with pytest.raises(ValueError, match="calls must be"):
        predict_step(0.1, 100, 2, Link(1), calls=0)


def _one_backward(link, compress=False):
    torch.manual_seed(0)
    model = DDP(nn.Linear(100, 100))
    if compress:
        model.register_comm_hook(OnLink(link, default_hooks.fp16_compress_hook), hook_on_link)
    else:
        model.register_comm_hook(link, simulated_link)
    torch.manual_seed(dist.get_rank())
    start = time.perf_counter()
    model(torch.randn(16, 100)).square().mean().backward()
    seconds = time.perf_counter() - start
    return model.module.weight.grad.clone(), seconds, traffic(link) if link else None


def test_the_link_delays_by_the_model_and_changes_no_result():
    plain = launch(_one_backward, 3, args=(None,)).results
    link = Link(gbit_per_s=0.01, latency_ms=20)  # 10 Mbit/s: 40 KB take 107 ms on 3 ranks
    slow = launch(_one_backward, 3, args=(link,)).results
    nbytes = 4 * (100 * 100 + 100)
    for (grad, _, _), (slow_grad, seconds, sent) in zip(plain, slow):
        assert torch.equal(grad, slow_grad)
        assert seconds >= link.seconds(nbytes, 3)
        assert sent == {"calls": 1, "mb": nbytes / 1e6}


def test_a_hook_on_the_link_sends_what_it_really_sends():
    link = Link(gbit_per_s=0.01, latency_ms=20)
    full = launch(_one_backward, 2, args=(link,)).results[0]
    half = launch(_one_backward, 2, args=(link, True)).results[0]
    assert half[2]["mb"] == pytest.approx(full[2]["mb"] / 2)  # fp16: half the bytes
    assert torch.allclose(half[0], full[0], atol=1e-3)


def _compressed_then_plain(slow, instant):
    _one_backward(slow, compress=True)  # patches dist.all_reduce onto `slow`
    before = traffic(slow)["calls"]
    _one_backward(instant)
    return before, traffic(slow)["calls"]


def test_a_plain_run_after_a_hook_on_the_link_does_not_pay_that_link():
    slow = Link(gbit_per_s=1, latency_ms=1, name="slow")
    before, after = launch(_compressed_then_plain, 2, args=(slow, Link(1e6, 0, "instant")),
                           backend="gloo").results[0]
    assert before >= 1 and after == before


def _own_all_reduce_after_a_hook_on_the_link(slow):
    _one_backward(slow, compress=True)
    before = traffic(slow)["calls"]
    dist.all_reduce(torch.ones(1))  # the rank's own, between steps
    return dist.all_reduce.__name__, traffic(slow)["calls"] - before


def test_the_ranks_own_all_reduce_after_a_hook_on_the_link_is_the_real_one():
    """hook_on_link puts torch's all_reduce back once its Future completes (review D8: it
    stayed patched for the rest of the rank process, and a learner's own all-reduce paid
    the link)."""
    slow = Link(gbit_per_s=1, latency_ms=1, name="slow")
    name, extra = launch(_own_all_reduce_after_a_hook_on_the_link, 2, args=(slow,),
                         backend="gloo").results[0]
    assert name == "all_reduce" and extra == 0


def test_links_with_the_same_numbers_and_different_names_are_different_links():
    assert Link(1, 0.1, "a") != Link(1, 0.1, "b")
    assert Link(1, 0.1, "a") == Link(1, 0.1, "a")


def test_the_interface_list_names_loopback_and_follows_gloo_socket_ifname(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    rows = {r["interface"]: r for r in network_interfaces()}
    assert rows["lo"]["ipv4"] == "127.0.0.1"
    assert rows["lo"]["gloo"] == "<- GLOO_SOCKET_IFNAME"
