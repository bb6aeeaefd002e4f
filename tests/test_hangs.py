"""Lesson 10's pictures: the values ranks read against the truth, and step costs."""

from matplotlib.patches import Rectangle

from course_lib.plots.style import HIGHLIGHT
from course_lib.teach.hangs import first_below, plot_reads, plot_step_costs, plot_stop_decisions


def _bars(fig):
    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]


def test_a_wrong_read_is_highlighted_and_a_right_one_is_not():
    fig = plot_reads([0.5, 1.5], truth=1.5, title="read before wait")
    colours = [bar.get_facecolor() for bar in _bars(fig)]
    from matplotlib.colors import to_rgba

    assert colours[0] == to_rgba(HIGHLIGHT) and colours[1] != to_rgba(HIGHLIGHT)


def test_step_costs_show_one_bar_per_approach_with_the_steps_taken():
    fig = plot_step_costs({"Join": 3.05, "flag": 2.03}, {"Join": [3, 5], "flag": [3, 3]})
    assert [len(_bars(type("F", (), {"axes": [ax]}))) for ax in fig.axes] == [2]
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("3.05 (steps per rank: 3, 5)" in t for t in texts)
    assert not any("ms" in t for t in texts)  # times moved between runs: not shown


def test_stop_decisions_mark_each_rank_alone_and_the_mean():
    losses = [[1.0, 0.5, 0.2, 0.1], [1.0, 0.6, 0.5, 0.45]]
    assert first_below(losses[0], 0.3) == 2 and first_below(losses[1], 0.3) is None
    fig = plot_stop_decisions(losses, target=0.3)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts == ["rank 0 alone\nstops at step 2"]  # rank 1 alone never stops
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "mean below target: all stop at step 3" in labels  # mean 0.275 at step 3


def test_collectives_issued_counts_this_ranks_collectives():
    import torch
    import torch.distributed as dist

    from course_lib import launch
    from course_lib.teach.hangs import collectives_issued

    def three_all_reduces():
        before = collectives_issued()
        for _ in range(3):
            dist.all_reduce(torch.ones(1))
        return collectives_issued() - before

    assert launch(three_all_reduces, 2, echo=False).results == [3, 3]
