"""The accumulation teaching module: the simulated link waits as modelled and leaves the
gradients unchanged; the per-step cost is read right from telemetry; the figures and the
widget draw what they are given."""

import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach.accumulation import (
    SlowLink,
    accumulation_explorer,
    plot_accumulation_grid,
    plot_allreduces_per_step,
    plot_grid_point,
    plot_link_and_rest,
    plot_loss_curves,
    plot_rank_gap,
    plot_reference_gap,
    plot_sync_cost,
    slow_link,
    sync_cost,
)
from course_lib.telemetry import Recorder


def test_link_seconds_are_latency_plus_bytes_over_bandwidth():
    link = SlowLink(gbit_per_s=2, latency_ms=1.5)  # 2 ranks: a ring of 2(N-1) = 2 messages
    assert link.seconds(0) == pytest.approx(2 * 1.5e-3)
    assert link.seconds(250_000_000) == pytest.approx(2 * 1.5e-3 + 1.0)  # 2 Gbit = 250 MB


@pytest.mark.parametrize("gbit, latency", [(0, 0.5), (-1, 0.5), (1, -0.1)])
def test_link_refuses_impossible_values(gbit, latency):
    with pytest.raises(ValueError, match="SlowLink needs"):
        SlowLink(gbit_per_s=gbit, latency_ms=latency)


def gradient_with(link):
    """One backward of a DDP model with the slow_link hook; its gradient and how long it took."""
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 4))
    model.register_comm_hook(link, slow_link)
    torch.manual_seed(dist.get_rank())
    start = time.perf_counter()
    model(torch.randn(16, 8)).square().mean().backward()
    return model.module.weight.grad.clone(), time.perf_counter() - start


def test_slow_link_waits_and_leaves_the_average_unchanged():
    plain = launch(gradient_with, world_size=2, args=(None,)).results
    link = SlowLink(gbit_per_s=1, latency_ms=80)
    slow = launch(gradient_with, world_size=2, args=(link,)).results
    for (fast_grad, _), (slow_grad, seconds) in zip(plain, slow):
        assert torch.equal(fast_grad, slow_grad)
        assert seconds >= 0.08  # the modelled wait is a lower bound on the backward's time
    assert torch.equal(plain[0][0], plain[1][0])  # and it is DDP's average on every rank


def recorded(calls_per_step, nbytes=1000, step_seconds=(0.01, 0.03, 0.02)):
    """A one-rank telemetry with known steps and all-reduces."""
    rec = Recorder()
    for step, (calls, seconds) in enumerate(zip(calls_per_step, step_seconds)):
        rec.record_row("spans", step, "step", 10.0 * step, 10.0 * step + seconds)
        for bucket in range(calls):
            rec.record_row("comms", step, "allreduce", bucket, nbytes, 10.0 * step, 10.0 * step)
    return rec.telemetry()


def test_sync_cost_counts_per_step_and_takes_the_median_time():
    cost = sync_cost(recorded([4, 4, 4]))
    assert cost == pytest.approx({"steps": 3, "allreduces": 4.0, "mb": 0.004, "seconds": 0.02,
                                  "link_seconds": 0.0, "rest_seconds": 0.02})


def test_sync_cost_splits_off_the_links_exact_time():
    """The link's part is the run's own all-reduces at the link's time for their bytes; the
    rest is the measured step minus it, so noise in the step lands in the rest only."""
    tel = recorded([4, 1, 4], step_seconds=(0.2, 0.3, 0.25))
    tel.world_size = 2  # a recorder outside a launch says 1
    link = SlowLink(gbit_per_s=1, latency_ms=10)
    one = link.seconds(1000, 2)
    cost = sync_cost(tel, link)
    assert cost["link_seconds"] == pytest.approx(4 * one)  # median of 4, 1 and 4 waits
    assert cost["rest_seconds"] == pytest.approx(sorted([0.2 - 4 * one, 0.3 - one,
                                                         0.25 - 4 * one])[1])


def test_sync_cost_without_steps_says_what_to_record():
    with pytest.raises(ValueError, match="rec.step"):
        sync_cost(Recorder().telemetry())


def test_figures_draw_one_bar_or_line_per_run():
    costs = {"a": sync_cost(recorded([4, 4, 4])), "b": sync_cost(recorded([1, 1, 1]))}
    fig = plot_sync_cost(costs, "title")
    assert [len(ax.patches) for ax in fig.axes] == [2, 2, 4]  # the link's part drawn over
    assert [p.get_height() for p in fig.axes[0].patches] == [4, 1]
    assert len(plot_rank_gap({"x": [0.1, 0.2], "y": [0.0, 0.0]}).axes[0].lines) == 2
    assert len(plot_loss_curves({"x": [1.0, 0.5]}, k=4).axes[0].lines) == 1
    assert len(plot_reference_gap({"x": 1e-2, "y": 0.0}, tolerance=1e-6).axes[0].patches) == 2
    fig = plot_allreduces_per_step(recorded([4, 4, 4]), "t")
    assert [p.get_height() for p in fig.axes[0].patches] == [4, 4, 4]


def grid():
    cost = sync_cost(recorded([1, 1, 1]))
    return {(mode, k, gbit): cost for mode in ("with", "without") for k in (1, 2)
            for gbit in (0.5, 5)}


def test_grid_figure_and_widget():
    fig = plot_accumulation_grid(grid())
    assert [len(ax.lines) for ax in fig.axes] == [4, 4]  # link alone, whole step: 2 modes x 2 links
    assert len(plot_grid_point(grid(), 2, 5).axes) == 3
    with pytest.raises(ValueError, match="no run with k=3"):
        plot_grid_point(grid(), 3, 5)
    box = accumulation_explorer(grid())
    k_slider, link_slider = box.children[0].children
    assert list(k_slider.options) == [1, 2] and list(link_slider.options) == [0.5, 5]
    link_slider.value = 5  # redraws from the cached grid, no error


def test_link_and_rest_draws_both_parts_per_setting():
    runs = {"a": [sync_cost(recorded([4, 4, 4]))] * 3, "b": [sync_cost(recorded([1, 1, 1]))] * 3}
    ax = plot_link_and_rest(runs, "t").axes[0]
    assert len(ax.patches) == 4  # per setting: the link's part and the rest
    assert "median of 3 runs" in ax.get_title()
