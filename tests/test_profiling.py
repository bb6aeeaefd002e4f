"""teach.profiling's breakdown on hand-made telemetry, its figures, and the merged Chrome trace
of a real 2-rank profiled run (written to artifacts/ and validated as a trace viewer reads it)."""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch, telemetry
from course_lib.teach.buckets import timed_backward
from course_lib.teach.profiling import (
    covered,
    overlap,
    plot_breakdown,
    plot_repeats,
    plot_step_times,
    step_time,
    time_breakdown,
)
from course_lib.telemetry import Telemetry

ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "06_merged_trace.json"


def payload(rank, spans, comms):
    """A Recorder.export()-shaped payload from (step, name, start, end) and (step, bucket,
    start, end) rows."""
    return {"rank": rank, "world_size": 2, "tables": {
        "scalars": {"step": [], "name": [], "value": []},
        "spans": dict(zip(("step", "name", "start", "end"), map(list, zip(*spans)))),
        "grads": {c: [] for c in ("step", "when", "bucket", "param", "index", "norm", "values")},
        "comms": {"step": [c[0] for c in comms], "op": ["allreduce"] * len(comms),
                  "bucket": [c[1] for c in comms], "bytes": [4] * len(comms),
                  "start": [c[2] for c in comms], "end": [c[3] for c in comms]},
        "batchnorm": {c: [] for c in ("step", "layer", "batch_mean", "batch_var",
                                      "running_mean", "running_var")},
        "samples": {"epoch": [], "position": [], "index": []}}}


def straggler_telemetry():
    """Rank 1 loads for 30 ms; rank 0 calls buckets 0 and 1 at 5 and 8 ms and waits."""
    fast = [(0, "step", 0.0, 0.05), (0, "data", 0.0, 0.001), (0, "forward", 0.001, 0.003),
            (0, "backward", 0.003, 0.009), (0, "wait for all-reduce", 0.009, 0.045),
            (0, "optimizer", 0.045, 0.046)]
    slow = [(0, "step", 0.0, 0.05), (0, "data", 0.0, 0.030), (0, "forward", 0.030, 0.032),
            (0, "backward", 0.032, 0.038), (0, "wait for all-reduce", 0.038, 0.045),
            (0, "optimizer", 0.045, 0.046)]
    return Telemetry.from_payloads([
        payload(0, fast, [(0, 0, 0.005, 0.042), (0, 1, 0.008, 0.045)]),
        payload(1, slow, [(0, 0, 0.034, 0.042), (0, 1, 0.037, 0.045)])])


def test_covered_counts_overlapping_intervals_once():
    assert covered([]) == 0
    assert covered([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4)
    assert covered([(1, 3), (0, 10)]) == pytest.approx(10)


def test_breakdown_splits_each_all_reduce_at_the_last_rank_call():
    got = time_breakdown(straggler_telemetry())
    # rank 0 waits from 5 ms until rank 1 calls bucket 1 at 37 ms (the buckets' waits overlap)
    assert got[0]["wait"] == pytest.approx(0.032)
    assert got[0]["communication"] == pytest.approx(0.045 - 0.005 - 0.032)
    assert got[1]["wait"] == pytest.approx(0.0)
    assert got[1]["communication"] == pytest.approx(0.045 - 0.034)
    assert got[0]["compute"] == pytest.approx(0.002 + 0.006 + 0.001)
    assert got[1]["data"] == pytest.approx(0.030)


def test_overlap_is_all_reduce_time_inside_backward():
    during, after = overlap(straggler_telemetry(), skip=0)[0]
    assert during == pytest.approx(0.009 - 0.005)
    assert after == pytest.approx(0.045 - 0.009)


def test_figures_draw():
    tel = straggler_telemetry()
    assert plot_breakdown({"a": tel, "b": tel}, skip=0).axes
    assert plot_step_times({"a": [0.2, 0.21, 0.19], "b": [0.05, 0.06, 0.05]}, "t").axes
    assert step_time(tel, skip=0) == pytest.approx(0.05)


def test_repeats_draw_the_median_and_a_whisker_from_fastest_to_slowest():
    ax = plot_repeats({"a": [30.0, 10.0, 20.0], "b": [5.0, 7.0, 6.0]}, "ms", "t").axes[0]
    assert [bar.get_width() for bar in ax.patches] == [20.0, 6.0]
    whiskers = [seg for coll in ax.collections for seg in coll.get_segments()]
    assert [(seg[0][0], seg[1][0]) for seg in whiskers] == [(10.0, 30.0), (5.0, 7.0)]
    assert ax.texts[0].get_text().strip() == "20.0 (10.0-30.0)"
    assert "median of 3 runs" in ax.get_title()


def test_repeats_refuse_a_single_number_with_what_to_do():
    with pytest.raises(ValueError, match="time each setting several times"):
        plot_repeats({"a": 12.0}, "ms", "t")


def _profiled_run(trace_dir):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 128)),
                bucket_cap_mb=0.05)
    rec = telemetry.Recorder()
    rec.watch_ddp(model, grads=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(3):
            with rec.step(step):
                with rec.span("forward"):
                    loss = model(torch.randn(8, 128)).square().mean()
                timed_backward(rec, model, loss)
    prof.export_chrome_trace(f"{trace_dir}/rank{dist.get_rank()}.json")


def test_merged_trace_of_a_2_rank_run_is_one_valid_trace(tmp_path):
    run = launch(_profiled_run, 2, args=(str(tmp_path),), echo=False)
    ARTIFACT.parent.mkdir(exist_ok=True)
    files = [tmp_path / "rank1.json", tmp_path / "rank0.json"]  # the rank comes from the file
    telemetry.merge_traces(files, ARTIFACT, run.telemetry)
    events = json.loads(ARTIFACT.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert {e["pid"] for e in events} == {0, 1}  # one process per rank, nothing else
    tracks: dict = {}
    for e in events:
        if e["ph"] != "M":
            assert e["ts"] >= 0
            assert e["ts"] >= tracks.get((e["pid"], e["tid"]), 0), "ts goes back on a track"
            tracks[(e["pid"], e["tid"])] = e["ts"]
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    for rank in (0, 1):
        assert (rank, "course: spans") in threads
        assert any(e["pid"] == rank and e["name"] == "gloo:all_reduce" for e in events)
        # one clock: the profiler's first DDP forward lies inside the recorder's first forward
        # span (an order, not a duration: 1 ms of slack for the two clocks' resolution; wrong
        # clocks put them seconds apart or more)
        ddp = min((e for e in events if e["pid"] == rank
                   and e["name"].startswith("DistributedDataParallel.forward")),
                  key=lambda e: e["ts"])
        ours = min((e for e in events if e["pid"] == rank and e["name"] == "forward"),
                   key=lambda e: e["ts"])
        assert ours["ts"] - 1000 <= ddp["ts"], f"rank {rank}: DDP forward before our span"
        assert ddp["ts"] + ddp["dur"] <= ours["ts"] + ours["dur"] + 1000, (
            f"rank {rank}: DDP forward ends after our forward span")


def test_merge_refuses_two_files_of_one_rank(tmp_path):
    trace = {"distributedInfo": {"rank": 0}, "traceEvents": []}
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(trace))
    with pytest.raises(ValueError, match="same rank"):
        telemetry.merge_traces([tmp_path / "a.json", tmp_path / "b.json"], tmp_path / "m.json")
