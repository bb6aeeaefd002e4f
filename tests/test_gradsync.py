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
