"""Plots: each returns a Figure whose axes, lines, bars and titles show what was recorded."""

import ipywidgets as widgets
import matplotlib
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib import launch, plots, telemetry
from course_lib.plots import explore, style
from course_lib.telemetry.columns import COLUMNS

matplotlib.use("Agg")


def _payload(rank, **tables):
    """A rank's export with the given rows (tuples in schema order) and empty other tables."""
    out = {name: {c: [] for c in cols} for name, cols in COLUMNS.items()}
    for name, rows in tables.items():
        out[name] = {c: list(v) for c, v in zip(COLUMNS[name], zip(*rows))}
    return {"rank": rank, "world_size": 2, "tables": out}


def _grad_rows(after_b):
    """Three parameters; every rank holds the same reduced gradient except, maybe, 'b'."""
    rows = []
    for i, (param, before, after) in enumerate([("a", 1.0, 2.0), ("b", 3.0, after_b),
                                                ("c", 5.0, 6.0)]):
        rows += [(0, "before", 0, param, i, before, [before]),
                 (0, "after", 0, param, i, after, [after])]
    return rows


def _grad_telemetry(differ):
    return telemetry.Telemetry.from_payloads([
        _payload(0, grads=_grad_rows(4.0)), _payload(1, grads=_grad_rows(4.5 if differ else 4.0))])


def _shaded(ax):
    return [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(
        style.HIGHLIGHT)]


def _line_labels(ax):
    return [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_gradient_plot_has_before_and_after_with_a_line_per_rank():
    fig = plots.gradients(_grad_telemetry(differ=False))
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    for ax in fig.axes:
        assert _line_labels(ax) == ["rank 0", "rank 1"]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
        assert not _shaded(ax)
    assert "identical on every rank" in fig.axes[1].get_title()
    assert "every rank should hold the same one" in fig.get_suptitle()


def test_gradient_plot_shades_parameters_whose_reduced_gradients_differ():
    fig = plots.gradients(_grad_telemetry(differ=True))
    shaded = _shaded(fig.axes[1])
    assert len(shaded) == 1 and not _shaded(fig.axes[0])
    left, right = shaded[0].get_x(), shaded[0].get_x() + shaded[0].get_width()
    assert left < 1 < right  # around parameter "b", the second tick
    assert "1 of 3 differ" in fig.axes[1].get_title()


def test_gradient_plot_draws_only_the_chosen_ranks_and_step():
    fig = plots.gradients(_grad_telemetry(differ=True), step=0, ranks=[1])
    assert _line_labels(fig.axes[0]) == ["rank 1"]
    assert not _shaded(fig.axes[1])  # nothing to compare against
    with pytest.raises(ValueError, match="watch_ddp"):
        plots.gradients(telemetry.Telemetry.from_payloads([_payload(0)]))


def _bn_rows(rank):
    return [(s, "bn", [s + rank, 0.0], [1.0, 1.0], [0.1 * s, 0.0], [1.0, 1.0]) for s in range(4)]


def test_batchnorm_plot_has_four_panels_with_a_line_per_rank():
    tel = telemetry.Telemetry.from_payloads([_payload(r, batchnorm=_bn_rows(r)) for r in (0, 1)])
    fig = plots.batchnorm(tel)
    assert len(fig.axes) == 4
    for ax in fig.axes:
        assert len(ax.get_lines()) == 2
    batch_mean = fig.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in batch_mean] == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert "BatchNorm layer 'bn', channel 0" in fig.get_suptitle()


def test_sample_heatmap_marks_indices_read_more_than_once():
    # rank 0 reads 0..4, rank 1 reads 5..9 and pads with 0 (as DistributedSampler does)
    ranks = [[(0, i, i) for i in range(5)], [(0, i, i + 5) for i in range(5)] + [(0, 5, 0)]]
    tel = telemetry.Telemetry.from_payloads(
        [_payload(r, samples=rows) for r, rows in enumerate(ranks)])
    fig = plots.samples(tel, dataset_size=11)
    ax = fig.axes[0]
    grid = ax.get_images()[0].get_array()
    assert grid.shape == (3, 11)  # rank 0, rank 1, all ranks x dataset indices
    assert grid[2].tolist() == [2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    marks = [c for c in ax.collections if isinstance(c, PathCollection)][0].get_offsets()
    assert marks.tolist() == [[0, 2]]  # one ×: index 0 in the "all ranks" row
    assert "1 index read more than once, 1 index not read" in ax.get_title(loc="left")


def _timeline_rows(rank, offset):
    spans = [(0, "step", 0.0 + offset, 1.0), (0, "forward", 0.1 + offset, 0.3),
             (0, "backward", 0.3, 0.6), (0, "optimizer", 0.7, 0.8)]
    comms = [(0, "allreduce", 0, 400, 0.4, 0.65), (0, "allreduce", 1, 400, 0.5, 0.7)]
    return _payload(rank, spans=spans, comms=comms)


def test_timeline_has_compute_and_communication_lanes_per_rank():
    tel = telemetry.Telemetry.from_payloads([_timeline_rows(0, 0.0), _timeline_rows(1, 0.05)])
    fig = plots.timeline(tel)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["rank 0 compute", "rank 0 communication", "rank 1 compute",
                      "rank 1 communication"]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    for compute_y, comm_y in ((0, -1), (-2, -3)):
        lane = [b for b in bars if round(b.get_y() + b.get_height() / 2) == compute_y]
        assert len(lane) == 6  # forward, backward, optimizer; idle before, between, after
        idle = [b.get_width() for b in lane if b.get_facecolor()[:3] == (221 / 255,) * 3]
        assert sum(idle) == pytest.approx(400)  # ms of the step that no span covers
        assert len([b for b in bars if round(b.get_y() + b.get_height() / 2) == comm_y]) == 2
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("b0") == 2 and texts.count("b1") == 2
    assert "Do the all-reduces run during backward?" in fig.get_suptitle()


def _scalar_telemetry(shift):
    return telemetry.Telemetry.from_payloads(
        [_payload(r, scalars=[(s, "loss", 1.0 / (s + 1) + r * shift) for s in range(5)])
         for r in (0, 1)])


def test_scalar_lines_per_rank_and_bars_per_rank():
    tel = _scalar_telemetry(shift=0.5)
    fig = plots.scalars(tel, "loss")
    assert _line_labels(fig.axes[0]) == ["rank 0", "rank 1"]
    assert fig.axes[0].get_lines()[1].get_ydata()[0] == 1.5
    bars = plots.rank_bars(tel, "loss", step=0)
    heights = [p.get_height() for p in bars.axes[0].patches]
    assert heights == [1.0, 1.5]
    assert bars.axes[0].patches[0].get_hatch() != bars.axes[0].patches[1].get_hatch()


def test_compare_runs_plots_both_runs_and_their_difference_against_the_tolerance():
    fig = plots.compare_runs(_scalar_telemetry(0.0), _scalar_telemetry(1e-3), ["loss"], tol=1e-6,
                             labels=("single", "ddp"))
    top, bottom = fig.axes
    assert _line_labels(top) == ["single", "ddp"]
    np.testing.assert_allclose(bottom.get_lines()[0].get_ydata(), 0.5e-3)  # mean over ranks
    assert bottom.get_lines()[1].get_ydata()[0] == 1e-6  # the tolerance line


def test_rank_styles_differ_without_colour():
    lines = {(s["linestyle"], s["marker"]) for s in map(style.rank_style, range(4))}
    hatches = {style.rank_bar_style(r)["hatch"] for r in range(4)}
    assert len(lines) == 4 and len(hatches) == 4


def test_explorer_redraws_with_the_chosen_step_and_ranks(monkeypatch):
    calls = []
    monkeypatch.setattr(explore, "display", lambda obj: None)
    box = plots.explorer(lambda step, ranks: calls.append((step, ranks)), [0, 1],
                         step=widgets.IntSlider(0, 0, 3))
    controls, toggles, _ = box.children
    controls.children[0].value = 2
    toggles.children[0].value = False
    assert calls == [(2, [0, 1]), (2, [1])]


def test_gradient_explorer_shows_the_static_figure_first(monkeypatch):
    shown = []
    monkeypatch.setattr(explore, "display", shown.append)
    box = plots.gradient_explorer(_grad_telemetry(differ=False))
    assert isinstance(box, widgets.VBox)
    assert len(shown) == 1 and isinstance(shown[0], Figure)


# -- a real run, every plot ---------------------------------------------------------------


def _train_everything():
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)))
    rec = telemetry.Recorder()
    rec.watch_ddp(model)
    rec.watch_batchnorm(model)
    data = TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    sampler = rec.watch_sampler(DistributedSampler(data))
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            with rec.step(epoch * len(loader) + i):
                with rec.span("forward"):
                    loss = F.mse_loss(model(x), y)
                with rec.span("backward"):
                    loss.backward()
                with rec.span("optimizer"):
                    opt.step()
                    opt.zero_grad()
                rec.scalar("loss", loss)
    return dist.get_rank()


def test_every_plot_renders_a_real_run(tmp_path):
    tel = launch(_train_everything, 2, backend="gloo", echo=False).telemetry
    figures = [plots.gradients(tel), plots.batchnorm(tel), plots.samples(tel),
               plots.timeline(tel, steps=[4, 5]), plots.scalars(tel), plots.rank_bars(tel, "loss"),
               plots.compare_runs(tel, tel)]
    for i, fig in enumerate(figures):
        assert fig.get_suptitle() or fig.axes[0].get_title()
        fig.savefig(tmp_path / f"{i}.png", dpi=50)
    assert "identical on every rank" in figures[0].axes[1].get_title()
    title = figures[2].axes[0].get_title(loc="left")
    assert "0 indices read more than once, 0 indices not read" in title


def test_batchnorm_explorer_offers_layers_and_channels(monkeypatch):
    shown = []
    monkeypatch.setattr(explore, "display", shown.append)
    tel = telemetry.Telemetry.from_payloads([_payload(r, batchnorm=_bn_rows(r)) for r in (0, 1)])
    controls, toggles, _ = plots.batchnorm_explorer(tel).children
    layer, channel = controls.children
    assert list(layer.options) == ["bn"] and (channel.min, channel.max) == (0, 1)
    assert len(toggles.children) == 2 and isinstance(shown[0], Figure)
    channel.value = 1  # draws channel 1 into the output widget
    assert len(shown) == 2 and "channel 1" in shown[1].get_suptitle()


def test_timeline_draws_only_the_ranks_asked_for():
    tel = telemetry.Telemetry.from_payloads([_timeline_rows(0, 0.0), _timeline_rows(1, 0.05)])
    labels = [t.get_text() for t in plots.timeline(tel, ranks=[1]).axes[0].get_yticklabels()]
    assert labels == ["rank 1 compute", "rank 1 communication"]
    with pytest.raises(ValueError, match="switch at least one rank on"):
        plots.timeline(tel, ranks=[])


def test_timeline_explorer_redraws_the_chosen_run_step_and_ranks(monkeypatch):
    from course_lib.plots import explore

    tel = telemetry.Telemetry.from_payloads([_timeline_rows(0, 0.0), _timeline_rows(1, 0.05)])
    other = telemetry.Telemetry.from_payloads([_timeline_rows(0, 0.0), _timeline_rows(1, 0.0)])
    drawn = []
    monkeypatch.setattr(explore, "timeline",
                        lambda t, steps, ranks=None: drawn.append((t, steps, ranks)) or "figure")
    monkeypatch.setattr(explore, "display", lambda fig: None)
    controls, toggles, _ = explore.timeline_explorer({"a": tel, "b": other}).children
    run, step = controls.children
    assert drawn == [(tel, [0], None)]  # the static figure: the first run's last step
    run.value = "b"
    toggles.children[0].value = False
    assert drawn[1:] == [(other, [0], [0, 1]), (other, [0], [1])]


# -- generic charts (plots/charts.py) --------------------------------------------------------


def test_lines_draws_one_styled_line_per_run():
    from course_lib.plots import charts

    curves = {"a": [4.0, 2.0, 1.0], "b": [4.0, 3.0, 2.5], "c": [1.0, 1.0, 1.0]}
    fig = charts.lines(curves, ylabel="loss", title="t", log=True)
    ax = fig.axes[0]
    drawn = ax.get_lines()
    assert [ln.get_label() for ln in drawn] == list(curves)
    assert [list(ln.get_ydata()) for ln in drawn] == list(curves.values())
    looks = {(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in drawn}
    assert len(looks) == 3 and ax.get_yscale() == "log" and ax.get_ylabel() == "loss"
    assert charts.series_style(9) == style.rank_style(9)  # any i: no magic modulus


def test_lines_ends_a_diverged_run_with_a_labelled_cross():
    from course_lib.plots import charts

    fig = charts.lines({"fine": [1.0, 0.5, 0.2], "diverged": [1.0, 8.0, float("inf"), 3.0]})
    ax = fig.axes[0]
    diverged = ax.get_lines()[1]
    assert list(diverged.get_ydata()) == [1.0, 8.0]  # stops at the first inf
    crosses = [ln for ln in ax.get_lines() if ln.get_marker() == "x"]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [2]
    assert [t.get_text() for t in ax.texts] == ["diverged: inf/nan from step 2"]


def test_bars_draws_one_labelled_bar_per_run():
    from course_lib.plots import charts

    values = {"1 MiB": 12.34, "25 MiB": 9.8, "none": 20.0}
    fig = charts.bars(values, ylabel="ms", fmt="{:.1f}", highlight=["none"])
    ax = fig.axes[0]
    drawn = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert [b.get_height() for b in drawn] == list(values.values())
    assert [t.get_text() for t in ax.get_xticklabels()] == list(values)
    assert [t.get_text() for t in ax.texts] == ["12.3", "9.8", "20.0"]
    assert len({b.get_hatch() for b in drawn}) == 3
    assert matplotlib.colors.to_hex(drawn[2].get_edgecolor()) == style.HIGHLIGHT.lower()


def test_charts_draw_into_a_given_axes_and_refuse_nothing_to_draw():
    from course_lib.plots import charts

    fig = style.new_figure(6, 3)
    left, right = fig.subplots(1, 2)
    assert charts.lines({"a": [1.0, 2.0]}, ax=left) is fig
    assert charts.bars({"a": 1.0}, ylabel="x", ax=right) is fig
    with pytest.raises(ValueError, match="no runs to draw"):
        charts.lines({})
    with pytest.raises(ValueError, match="not among the runs"):
        charts.bars({"a": 1.0}, ylabel="x", highlight=["b"])
