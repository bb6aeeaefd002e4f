"""verify_gradients() on real ranks: DDP's gradients are reported in sync; a desync made on
purpose is found, with the right parameter and the right size."""

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach.gradsync import GradSyncReport, plot_differences, verify_gradients


def tiny_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def backward_on_own_data(model):
    torch.manual_seed(100 + dist.get_rank())  # every rank its own batch
    model(torch.randn(8, 4)).square().mean().backward()


def ddp_report():
    model = DDP(tiny_net())
    backward_on_own_data(model)
    return verify_gradients(model)


def plain_report():
    model = tiny_net()  # no DDP: each rank keeps its own gradient
    backward_on_own_data(model)
    return verify_gradients(model)


def nudged_report(delta):
    """DDP, then rank 1 changes one element of one gradient after the all-reduce."""
    model = DDP(tiny_net())
    backward_on_own_data(model)
    if dist.get_rank() == 1:
        model.module[2].bias.grad[1] += delta
    return verify_gradients(model)


def missing_report():
    """A gradient that exists on rank 0 only; and one that no rank has."""
    model = tiny_net()
    model(torch.ones(2, 4)).sum().backward()
    model[0].bias.grad = None
    if dist.get_rank() == 0:
        model[0].bias.grad = torch.zeros(6)
    model[2].bias.grad = None
    return verify_gradients(model)


def test_ddp_gradients_are_in_sync_on_every_rank():
    reports = launch(ddp_report, 3, echo=False).results
    for report in reports:
        assert report.in_sync, report.table()
        assert report.max_difference == 0.0
        assert list(report.differences) == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert report.world_size == 3
        assert "in sync" in report.verdict()
    assert all(r == reports[0] for r in reports)


def test_without_ddp_every_parameter_differs():
    for report in launch(plain_report, 2, echo=False).results:
        assert not report.in_sync
        assert report.out_of_sync == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert "OUT OF SYNC" in report.verdict() and "4 of 4 parameters differ" in str(report)


@pytest.mark.parametrize("delta", [0.25, 1e-3])
def test_a_desync_made_on_purpose_is_found_with_its_size(delta):
    reports = launch(nudged_report, 2, args=(delta,), echo=False).results
    for report in reports:
        assert report.out_of_sync == ["2.bias"], report.table()
        assert math.isclose(report.differences["2.bias"], delta, rel_tol=1e-5)
        assert report.differences["0.weight"] == 0.0
        assert "largest: 2.bias" in report.verdict()
        assert "DIFFER" in report.table().splitlines()[-1]
    assert reports[0] == reports[1]


def test_a_gradient_present_on_some_ranks_only_is_reported_missing():
    for report in launch(missing_report, 2, echo=False).results:
        assert report.missing == ("0.bias",)
        assert report.unused == ("2.bias",)
        assert report.out_of_sync == ["0.bias"]
        assert math.isnan(report.differences["0.bias"])
        assert "0.bias has a gradient on some ranks only" in report.verdict()


def test_tiny_differences_from_summation_order_count_as_equal():
    report = GradSyncReport(2, {"w": 1e-9}, {"w": 10.0})
    assert report.in_sync
    assert not GradSyncReport(2, {"w": 1e-4}, {"w": 10.0}).in_sync


def test_plot_marks_each_report():
    ok = GradSyncReport(2, {"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 1.0})
    bad = GradSyncReport(2, {"a": 0.5, "b": 0.0}, {"a": 1.0, "b": 1.0})
    fig = plot_differences({"DDP": ok, "nudged": bad})
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["DDP: in sync", "nudged: OUT OF SYNC"]


def test_sync_per_step_shades_the_steps_a_crash_never_reached():
    from course_lib import telemetry
    from course_lib.teach.gradsync import GRADIENT_DIFFERENCE, plot_sync_per_step

    rec = telemetry.Recorder()
    rec.scalar(GRADIENT_DIFFERENCE, 0.25, step=0)  # step 0 ran, without an all-reduce
    fig = plot_sync_per_step(rec.telemetry(), "crashed at step 1", steps=4)
    calls, diffs = fig.axes
    assert [t.get_text() for t in calls.get_xticklabels()] == ["0", "1", "2", "3"]
    assert any("not reached" in t.get_text() for t in diffs.texts)
    assert [t.get_text() for t in diffs.texts if not t.get_text().startswith("not")] == ["0.25"]


# -- the lesson's other pictures: rank agreement, backward spans, bucket layouts ------------

def agreement_run():
    """Two ranks' MLP step recorded by watch_ddp, plus the true cosine per parameter."""
    from course_lib import telemetry
    from course_lib.teach.buckets import timed_backward

    model = DDP(tiny_net())
    rec = telemetry.Recorder()
    rec.watch_ddp(model)
    torch.manual_seed(100 + dist.get_rank())
    x = torch.randn(8, 4)
    own = [g.detach().clone() for g in torch.autograd.grad(
        model.module(x).square().mean(), list(model.parameters()))]
    with rec.step(0):
        timed_backward(rec, model, model(x).square().mean())
    cosines = []
    for g in own:
        everyone = [torch.empty_like(g) for _ in range(2)]
        dist.all_gather(everyone, g)
        cosines.append(float(nn.functional.cosine_similarity(
            everyone[0].reshape(1, -1), everyone[1].reshape(1, -1))))
    return cosines


def test_rank_agreement_cosine_from_norms_is_the_true_cosine():
    from course_lib.teach.gradsync import plot_rank_agreement

    run = launch(agreement_run, 2, echo=False)
    fig = plot_rank_agreement(run.telemetry)
    drawn = [t.get_text() for t in fig.axes[1].texts]  # bar labels: before, then after
    want = [f"{c:.2f}" for c in run.results[0]]
    assert drawn[:len(want)] == want
    assert drawn[len(want):] == ["1"] * len(want)  # identical after the all-reduce


def test_rank_agreement_refuses_other_world_sizes():
    from course_lib import telemetry
    from course_lib.teach.gradsync import plot_rank_agreement

    empty = telemetry.Recorder().export()
    tel = telemetry.Telemetry.from_payloads([dict(empty, rank=r, world_size=3) for r in range(3)])
    with pytest.raises(ValueError, match="launch it with world_size=2"):
        plot_rank_agreement(tel)


def test_timed_backward_splits_backward_at_the_last_gradient():
    run = launch(agreement_run, 2, echo=False)
    for rank in (0, 1):
        spans = run.telemetry.spans.where(rank=rank)
        names = spans["name"].tolist()
        assert names == ["backward", "wait for all-reduce", "step"]
        backward, wait = spans.where(name="backward"), spans.where(name="wait for all-reduce")
        assert backward["start"][0] < backward["end"][0] == wait["start"][0] <= wait["end"][0]
        comms = run.telemetry.comms.where(rank=rank)
        assert comms["end"][0] <= wait["end"][0]  # backward returns after its all-reduce


LAYOUTS = {None: {"calls": [1, 2, 2], "buckets": [1050624, 7354368]},
           25: {"calls": [1, 1, 1], "buckets": [8404992]}}


def test_bucket_layouts_draw_one_row_per_cap_and_a_segment_per_bucket():
    from course_lib.teach.buckets import plot_bucket_layout, plot_bucket_layouts

    fig = plot_bucket_layouts(LAYOUTS)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["default (not set)", "25 MB"]
    assert len(ax.patches) == 3
    texts = [t.get_text() for t in ax.texts]  # bucket sizes (MB), then the calls per row
    assert texts == ["1.00", "7.01", "2 all-reduces per step", "8.02", "1 all-reduce per step"]
    one = plot_bucket_layout(LAYOUTS, None)
    assert "[1, 2, 2]" in one.axes[0].get_title()
    assert any("first bucket 1 MiB" in t.get_text() for t in one.axes[0].texts)
    with pytest.raises(ValueError, match="no run with bucket_cap_mb=4"):
        plot_bucket_layout(LAYOUTS, 4)


def test_bucket_explorer_redraws_from_the_cached_layouts(monkeypatch):
    import ipywidgets as widgets

    from course_lib.teach import buckets

    drawn = []
    monkeypatch.setattr(buckets, "plot_bucket_layout",
                        lambda layouts, cap: drawn.append((layouts, cap)) or "figure")
    slider, _ = buckets.bucket_explorer(LAYOUTS).children
    assert isinstance(slider, widgets.SelectionSlider)
    assert list(slider.options) == ["default (not set)", "25 MB"]
    slider.value = "25 MB"
    assert drawn == [(LAYOUTS, None), (LAYOUTS, 25)]  # the first cap at once, then the chosen one
