"""Lesson 15's shared measurements and pictures: samples read twice, torchrun's per-node
variables and a sampler split by node, the predicted speed-up, the loss curves with their
divergence marked."""

import math
import os

import pytest
import torch.distributed as dist

from course_lib import launch, telemetry
from course_lib.plots.charts import first_non_finite
from course_lib.teach.case_files import (
    as_node,
    plot_curves,
    plot_speedup,
    predicted_speedup,
    shared_samples,
    split_by_node,
)
from course_lib.teach.scaling_model import Link, predict_step


def _read(overlap):
    rec = telemetry.Recorder()
    rank = dist.get_rank()
    start = rank * (10 - overlap)  # rank 1 starts `overlap` indices before rank 0 ends
    rec.samples(list(range(start, start + 10)), epoch=0)
    return None


@pytest.mark.parametrize("overlap", [0, 3])
def test_shared_samples_counts_indices_read_by_more_than_one_rank(overlap):
    run = launch(_read, world_size=2, args=(overlap,), echo=False, backend="gloo")
    assert shared_samples(run.telemetry) == overlap


def _node_variables():
    as_node(2)
    return {k: os.environ[k] for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}


def test_as_node_sets_torchruns_per_node_variables_for_two_nodes():
    got = launch(_node_variables, world_size=4, echo=False, backend="gloo").results
    assert [v["LOCAL_RANK"] for v in got] == ["0", "1", "0", "1"]
    assert [v["GROUP_RANK"] for v in got] == ["0", "0", "1", "1"]
    assert {v["LOCAL_WORLD_SIZE"] for v in got} == {"2"}


def test_split_by_node_finds_ranks_of_equal_local_rank_reading_the_same_samples():
    halves = [[0, 1], [2, 3], [0, 1], [2, 3]]  # a sampler told the local rank and world size
    assert split_by_node(halves, nodes=2)
    assert not split_by_node([[0], [1], [2], [3]], nodes=2)  # a correct split
    assert not split_by_node([[0, 1]] * 4, nodes=2)  # no sampler at all: the node's ranks agree
    assert not split_by_node(halves[:2], nodes=1)


def test_first_non_finite():
    assert first_non_finite([1.0, 2.0]) is None
    assert first_non_finite([1.0, math.inf, math.nan]) == 1
    assert first_non_finite([math.nan]) == 0


def test_predicted_speedup_is_n_times_compute_over_the_modelled_step():
    link = Link(gbit_per_s=8, latency_ms=1)
    step = predict_step(0.1, 4 * 10**6, 8, link, calls=4)
    assert predicted_speedup(0.1, 10**6, link, 4, 8) == pytest.approx(8 * 0.1 / step)
    one, four = (predicted_speedup(0.1, 10**6, link, c, 8) for c in (1, 4))
    assert four < one < 8
    assert predicted_speedup(1e6, 10**6, link, 4, 8) == pytest.approx(8, rel=1e-3)


def test_plot_curves_uses_a_log_scale_and_marks_where_a_run_reached_inf():
    fig = plot_curves({"fine": [4.0, 2.0, 1.0], "diverges": [4.0, 1e9, math.inf]})
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert any("inf/nan from step 2" in t.get_text() for t in ax.texts)


def test_plot_speedup_draws_one_line_per_loop_and_labels_the_measured_point():
    fig = plot_speedup(10**6, Link(gbit_per_s=10), {"4 all-reduces": 4, "1 all-reduce": 1}, 0.01)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "4 all-reduces" in labels and "1 all-reduce" in labels
    here = f"{predicted_speedup(0.01, 10**6, Link(gbit_per_s=10), 1, 8):.1f}x"
    assert here in [t.get_text() for t in ax.texts]


def test_speedup_explorer_redraws_for_another_link_and_world_size():
    from course_lib.teach.case_files import speedup_explorer

    box = speedup_explorer(10**6, {"4 all-reduces": 4, "1 all-reduce": 1}, 0.01)
    links, world = box.children[0].children
    links.value, world.value = "1 GbE", 16  # each change redraws; an error would raise here
    assert (links.value, world.value) == ("1 GbE", 16)
