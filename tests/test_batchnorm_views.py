"""Lesson 05's BatchNorm pictures draw what they are given: the running means next to the
data's, the gap to whole-batch BatchNorm by per-rank batch size, and a slider over sizes."""

import matplotlib
import pytest
import torch
from torch import nn

from course_lib.plots import explore
from course_lib.teach import batchnorm_views
from course_lib.teach.batchnorm_views import (
    batch_size_explorer,
    normalisation_gap,
    plot_eval_statistics,
    plot_gap_by_batch_size,
)

matplotlib.use("Agg")
CHANNELS = 3


def per_rank_shares(size: int, seed: int, ranks: int = 2) -> list:
    """One global batch split over `ranks`, each share normalised on its own (plain BN)."""
    x = torch.randn(size * ranks, CHANNELS, generator=torch.Generator().manual_seed(seed))
    return [(part, nn.functional.batch_norm(part, None, None, training=True))
            for part in x.chunk(ranks)]


def test_the_gap_is_zero_for_whole_batch_statistics_and_not_for_per_rank_ones():
    x = torch.randn(8, CHANNELS)
    whole = nn.functional.batch_norm(x, None, None, training=True)
    assert normalisation_gap([(x[:4], whole[:4]), (x[4:], whole[4:])]) < 1e-6
    assert normalisation_gap(per_rank_shares(4, seed=0)) > 0.05


def test_the_gap_figure_averages_each_size_and_shrinks_with_it():
    by_size = {n: [per_rank_shares(n, seed) for seed in range(5)] for n in (2, 8, 64)}
    ax = plot_gap_by_batch_size(by_size).axes[0]
    average = ax.get_lines()[-1]
    assert list(average.get_xdata()) == [2, 8, 64]
    heights = list(average.get_ydata())
    assert heights[0] > heights[1] > heights[2]
    assert heights[0] == pytest.approx(
        sum(normalisation_gap(s) for s in by_size[2]) / 5)


def test_the_eval_statistics_figure_shows_each_mean_it_is_given():
    data = [torch.tensor([0.0, 0.1]), torch.tensor([3.0, 2.9])]
    running = {"plain BatchNorm": torch.tensor([0.05, 0.0]),
               "SyncBatchNorm": torch.tensor([1.5, 1.4])}
    ax = plot_eval_statistics(data, running).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["mean of rank 0's inputs", "mean of rank 1's inputs", "mean of all inputs",
                      "running mean, plain BatchNorm", "running mean, SyncBatchNorm"]
    heights = [round(p.get_height(), 4) for p in ax.patches]
    assert heights == [0.0, 0.1, 3.0, 2.9, 1.5, 1.5, 0.05, 0.0, 1.5, 1.4]


def test_the_explorer_redraws_the_chosen_size_from_the_stored_results(monkeypatch):
    shown = []
    monkeypatch.setattr(batchnorm_views, "display", shown.append)  # the first view
    monkeypatch.setattr(explore, "display", shown.append)  # what the slider redraws
    by_size = {n: [per_rank_shares(n, seed=1)] for n in (2, 16)}
    slider, _ = batch_size_explorer(by_size).children
    assert list(slider.options) == [2, 16]
    slider.value = 16
    assert [fig.get_suptitle() for fig in shown] == [
        "2 samples per rank, plain BatchNorm", "16 samples per rank, plain BatchNorm"]
    drawn = shown[-1].axes[1].get_lines()[1].get_ydata()  # rank 1's normalised values
    assert list(drawn) == by_size[16][0][1][1].flatten().tolist()
