"""Lesson 17's pipeline measurements: a paced stage takes its time and leaves the numbers
alone, the saved-activation meter counts what autograd keeps (and frees), the bubble and the
micro-batches in flight are read right from spans, torch's schedules record one span per
micro-batch's forward and backward, and the pictures draw what they are given."""

import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from course_lib import launch
from course_lib.launching.run import LogLine, Run
from course_lib.teach.pipeline import (
    Paced,
    SavedActivations,
    bubble,
    in_flight,
    record_chunks,
    theory_bubble,
)
from course_lib.teach.pipeline_views import (
    plot_activations,
    plot_p2p_hang,
    plot_pipeline,
    plot_stage_ratios,
)
from course_lib.telemetry import Recorder, Telemetry
from course_lib.telemetry.columns import COLUMNS


def schedule_spans(p, m, forward=1.0, backward=2.0):
    """The spans of an ideal GPipe step: stage s runs forward i in slot s + i, and backward i
    after the last stage's, in reverse stage order (times in seconds)."""
    payloads = []
    for s in range(p):
        rows = [(0, f"F{i}", (s + i) * forward, (s + i + 1) * forward) for i in range(m)]
        start = (m + p - 1) * forward
        rows += [(0, f"B{i}", start + (p - 1 - s + i) * backward,
                  start + (p - s + i) * backward) for i in range(m)]
        tables = {name: {column: [] for column in columns} for name, columns in COLUMNS.items()}
        tables["spans"] = {"step": [r[0] for r in rows], "name": [r[1] for r in rows],
                           "start": [r[2] for r in rows], "end": [r[3] for r in rows]}
        payloads.append({"rank": s, "world_size": p, "tables": tables})
    return Telemetry.from_payloads(payloads)


@pytest.mark.parametrize("p, m", [(2, 1), (4, 2), (4, 8), (3, 5)])
def test_the_bubble_of_an_ideal_gpipe_step_is_the_formulas(p, m):
    tel = schedule_spans(p, m)
    assert bubble(tel, step=0) == pytest.approx(theory_bubble(p, m))
    assert theory_bubble(4, 2) == pytest.approx(0.6)


def test_an_ideal_gpipe_stage_holds_every_micro_batch():
    tel = schedule_spans(4, 6)
    assert [in_flight(tel, 0, r) for r in range(4)] == [6, 6, 6, 6]


def test_paced_takes_its_time_and_leaves_values_and_gradients_alone():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    layer(x).sum().backward()
    want = layer.weight.grad.clone()
    layer.zero_grad()
    paced = Paced(layer, forward_ms=30, backward_ms=60)
    start = time.perf_counter()
    out = paced(x)
    forward_s = time.perf_counter() - start
    assert torch.equal(out, layer(x))
    start = time.perf_counter()
    out.sum().backward()
    assert forward_s >= 0.03 and time.perf_counter() - start >= 0.06
    assert torch.equal(layer.weight.grad, want)
    with torch.no_grad():
        assert paced(x).grad_fn is None


def test_saved_activations_counts_kept_tensors_once_and_frees_them_in_backward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    with SavedActivations(model) as saved:
        outs = [model(torch.randn(5, 8)) for _ in range(2)]  # two micro-batches' forwards
        held_after_forwards = saved.now
        for out in outs:
            out.sum().backward()
    # per forward: the input, the tanh's output (saved by tanh and by the next Linear: once)
    one = 2 * 5 * 8 * 4
    assert held_after_forwards == saved.peak == 2 * one
    assert saved.now == 0 and not saved.held


def _chunk_spans(schedule, n_micro):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    part = nn.Sequential(nn.Linear(4, 4), nn.Tanh()) if rank < world_size - 1 else nn.Linear(4, 1)
    stage = PipelineStage(part, rank, world_size, torch.device("cpu"))
    pipe = schedule(stage, n_microbatches=n_micro, loss_fn=nn.functional.mse_loss)
    rec = Recorder()
    record_chunks(stage, rec)
    x = torch.randn(8, 4)
    with rec.step(0):
        if stage.is_first:
            pipe.step(x)
        else:
            pipe.step(target=x[:, :1])
    return sorted(rec.telemetry().spans.where(step=0)["name"].tolist())


@pytest.mark.parametrize("schedule, held", [(ScheduleGPipe, [4, 4]), (Schedule1F1B, [2, 1])])
def test_torchs_schedules_record_a_span_per_chunk_and_hold_what_they_should(schedule, held):
    run = launch(_chunk_spans, world_size=2, backend="gloo", args=(schedule, 4), echo=False)
    names = sorted([f"F{i}" for i in range(4)] + [f"B{i}" for i in range(4)] + ["step"])
    assert run.results == [names, names]
    tel = run.telemetry
    assert [in_flight(tel, 0, r) for r in range(2)] == held
    assert 0 <= bubble(tel, 0) < 1


def test_pictures_draw_what_they_are_given():
    tel = schedule_spans(3, 4, forward=0.01, backward=0.02)
    fig = plot_pipeline(tel, 0, "GPipe")
    assert isinstance(fig, Figure)
    assert fig.axes[0].get_title().count("33%") == 2  # (3 - 1) / (4 + 3 - 1), measured, formula
    fig = plot_activations({"GPipe": tel}, 0, {"GPipe": [4096, 4096, 4096]})
    assert [ax.get_title() for ax in fig.axes][1] == "Peak activation memory per stage"
    fig = plot_stage_ratios({"a": [1.0, 4.0], "b": [0.25, 1.0]}, "ratio", "title")
    assert len(fig.axes[0].patches) == 4


def test_the_p2p_picture_marks_each_ranks_last_operation():
    logs = [LogLine(0, "stdout", 100.0, "p2p send activation 0 to rank 1"),
            LogLine(1, "stdout", 100.1, "p2p recv activation 0 from rank 0"),
            LogLine(0, "stdout", 100.2, "p2p send activation 1 to rank 1"),
            LogLine(1, "stdout", 100.3, "p2p send gradient 0 to rank 0"),
            LogLine(0, "stdout", 100.3, "not a p2p line")]
    run = Run(2, "gloo", logs=logs, timings=[{"started": 99.0}, {"started": 99.0}],
              wall_time=6.0)
    fig = plot_p2p_hang(SimpleNamespace(run=run))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert sum("waited" in t for t in texts) == 2
    assert any(t.startswith("send gradient 0") and "waited 4.7 s" in t for t in texts)
    with pytest.raises(ValueError, match="print one before each send"):
        plot_p2p_hang(SimpleNamespace(run=Run(2, "gloo")))
