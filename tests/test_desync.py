"""The desync report: each failed launch lines up the ranks' collectives (PyTorch's flight
recorder) and names the first point where they differ, and which ranks were where."""

import os
import signal
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import DistributedError, launch
from course_lib.launching.desync_report import Call, RankTrace, build


def _fail(fn, world_size, **kwargs) -> DistributedError:
    with pytest.raises(DistributedError) as info:
        launch(fn, world_size, echo=False, **kwargs)
    assert info.value.desync is not None, "the flight recorder is on by default"
    return info.value


# -- on real ranks --------------------------------------------------------------------------

def _returns_early():
    t = torch.ones(3)
    for i in range(3):
        if dist.get_rank() == 1 and i == 2:
            return "done"
        dist.all_reduce(t)


def test_a_rank_that_returns_early_is_named_while_the_others_wait_in_the_next():
    err = _fail(_returns_early, 3)
    report = err.desync
    assert report.first_difference == 3
    assert "rank 1 returned after its 2nd collective" in report.summary
    assert "ranks 0 and 2 were in their 3rd (all_reduce [3]" in report.summary
    assert "Rank(s) 1 returned normally" in err.headline  # the headline names it too
    assert "returned" in str(err) and ">>    3 |" in str(err)


def _skips_one():
    for _ in range(2):
        if dist.get_rank() != 1:
            dist.all_reduce(torch.ones(1))  # rank 1 skips this one
        dist.all_reduce(torch.ones(1))


def test_a_skipped_collective_is_traced_to_where_the_pairing_went_wrong():
    report = _fail(_skips_one, 2).desync
    assert report.first_difference == 3  # rank 0's 3rd finds no partner
    assert "rank 1 returned after its 2nd collective" in report.summary
    assert "collective #1 matched in kind and shape but came from different lines" in (
        report.summary)


def _different_collectives():
    t = torch.ones(2, 4)
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        dist.broadcast(t, 1)


def test_ranks_in_different_collectives_are_shown_side_by_side():
    report = _fail(_different_collectives, 2, timeout=4).desync
    assert report.first_difference == 2
    assert "rank 0 was in its 2nd (all_reduce [1]" in report.summary
    assert "rank 1 was in its 2nd (broadcast [2, 4]" in report.summary


def _different_shapes():
    dist.all_reduce(torch.ones(8 if dist.get_rank() == 0 else 4))


def test_different_shapes_show_at_their_sequence_number():
    # gloo aborts the rank that receives more than it expects (SIGABRT: no dump from it);
    # with 3 ranks two dumps remain, and rank 0's is among them
    report = _fail(_different_shapes, 3).desync
    assert report.first_difference == 1
    assert "all_reduce [8]" in report.summary and "all_reduce [4]" in report.summary
    assert len(report.missing) <= 1 and 0 not in report.missing


def _rank0_validates_with_ddp():
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    for _ in range(2):
        model(torch.randn(16, 4)).pow(2).mean().backward()
        if dist.get_rank() == 0:
            model(torch.randn(16, 4))  # a forward on rank 0 only: DDP broadcasts buffers


def test_a_rank_0_only_ddp_forward_shows_ddp_buffer_broadcast_against_backward():
    report = _fail(_rank0_validates_with_ddp, 2, timeout=4).desync
    diff = report.first_difference
    rank0, rank1 = (t.at(diff) for t in report.traces)
    assert rank0.op == "broadcast" and "DDP's buffer broadcast" in rank0.where
    assert rank1.op == "all_reduce" and "backward" in rank1.where
    assert "_rank0_validates_with_ddp, line" in report.summary


def _stuck_inside_or_outside():
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # blocks: rank 1 never comes
    else:
        while True:
            time.sleep(0.05)


def test_at_the_timeout_a_rank_blocked_in_a_collective_still_dumps_its_recorder():
    # the process-group timeout is longer than the launch's: rank 0 is still blocked inside
    # gloo when the launcher asks for the dump, so only the watcher thread can answer
    err = _fail(_stuck_inside_or_outside, 2, timeout=3, pg_timeout=30)
    rank0, rank1 = err.desync.traces
    assert (rank0.ended, rank0.inside, rank0.last) == ("still running", True, 2)
    assert not rank0.calls[-1].completed
    assert (rank1.ended, rank1.inside, rank1.last) == ("still running", False, 1)
    assert "outside any collective" in err.desync.summary


def test_without_the_recorder_the_error_still_names_the_rank_that_returned():
    with pytest.raises(DistributedError) as info:
        launch(_returns_early, 3, echo=False, desync_report=False)
    assert info.value.desync is None
    assert "Rank(s) 1 returned normally" in str(info.value)


# -- the report itself ------------------------------------------------------------------------

def _calls(*labels: str) -> list[Call]:
    return [Call(i + 1, op, ((int(n),),), f"f, line {10 + i}", "f.py", True)
            for i, (op, n) in enumerate(label.split() for label in labels)]


def test_agreeing_ranks_give_no_difference_and_say_so():
    traces = [RankTrace(r, _calls("all_reduce 3", "broadcast 2"), "still running")
              for r in range(2)]
    report = build(traces)
    assert report.first_difference is None and "no desync" in report.summary


def test_a_rank_without_a_dump_is_named_and_left_out_of_the_comparison():
    traces = [RankTrace(0, _calls("all_reduce 3"), "raised RuntimeError", inside=True),
              RankTrace(1, [], "killed by SIGABRT", dumped=False)]
    report = build(traces)
    assert report.missing == [1] and "Rank(s) 1 left no flight-recorder dump" in report.summary
    assert "? (no dump)" in report.table()
    assert "Rank 0 issued 1 collective(s)." in report.summary  # one rank: not "the same"


def test_ranks_that_all_raised_are_not_sent_to_their_stacks():
    traces = [RankTrace(r, _calls("all_reduce 3"), "raised ValueError") for r in range(2)]
    report = build(traces)
    assert "no desync" in report.summary and "stuck outside" not in report.summary


def test_the_table_marks_the_first_difference_and_the_collective_each_rank_was_in():
    traces = [RankTrace(0, _calls("all_reduce 3", "all_reduce 1"), "raised RuntimeError",
                        inside=True),
              RankTrace(1, _calls("all_reduce 3", "broadcast 4"), "raised RuntimeError",
                        inside=True)]
    table = build(traces).table()
    assert ">>    2 | all_reduce [1] <<" in table and "broadcast [4] <<" in table


def test_the_picture_draws_a_box_per_collective_and_highlights_the_difference():
    from matplotlib.patches import FancyBboxPatch, Rectangle

    from course_lib.teach.desync_picture import plot_desync

    traces = [RankTrace(0, _calls("all_reduce 3", "all_reduce 3"), "raised RuntimeError",
                        inside=True),
              RankTrace(1, _calls("all_reduce 3"), "returned")]
    fig = plot_desync(build(traces))
    ax = fig.axes[0]
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch)]
    assert len(boxes) == 4  # 2 ranks x 2 collectives, the missing one drawn empty
    assert sum(p.get_linewidth() == 3 for p in boxes) == 1  # rank 0, blocked in #2
    assert any(isinstance(p, Rectangle) and not isinstance(p, FancyBboxPatch)
               for p in ax.patches)  # the shaded difference
    assert "#2" in ax.get_title(loc="left")


def test_the_picture_refuses_an_error_without_a_report():
    from course_lib.teach.desync_picture import plot_desync

    with pytest.raises(ValueError, match="desync_report=False"):
        plot_desync(ValueError("not a launch error"))


# -- dead ranks, gloo's mismatch, exceptions, call sites, NCCL (issue 29) ----------------------

def _killed_after_one():
    dist.all_reduce(torch.ones(2))
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(2))


def test_a_killed_rank_is_never_counted_as_agreeing():
    report = _fail(_killed_after_one, 2, pg_timeout=5).desync
    assert report.missing == [1]
    assert "no desync" not in report.summary and "agree" not in report.summary
    assert "Rank(s) 1 left no flight-recorder dump" in report.summary
    assert "not shown to be free of a desync" in report.summary
    from dataclasses import replace

    from course_lib.teach.desync_picture import plot_desync

    # the picture's title: even where the survivors' logs agree, not "no desync"
    fig = plot_desync(replace(report, first_difference=None))
    title = fig.axes[0].get_title(loc="left")
    assert "no desync" not in title and "rank(s) 1" in title


def _sizes_differ():
    dist.all_reduce(torch.ones(100 + dist.get_rank()))


def test_gloo_s_own_mismatch_message_names_the_desync():
    # 3 ranks: the rank that receives more bytes than it expects aborts (SIGABRT) with gloo's
    # "Received data size doesn't match expected size" on stderr (measured: 64 vs 60 bytes)
    err = _fail(_sizes_differ, 3, pg_timeout=5)
    report = err.desync
    assert report.mismatch, str(err)
    assert report.summary.startswith("Desync: gloo's own check failed on rank(s)")
    assert "no desync" not in report.summary


def _raises_between():
    dist.all_reduce(torch.ones(2))
    if dist.get_rank() == 1:
        raise ValueError("bad config")
    dist.all_reduce(torch.ones(2))


def test_a_rank_that_raised_outside_a_collective_leads_the_summary():
    report = _fail(_raises_between, 2, pg_timeout=5).desync
    assert report.summary.startswith("rank 1 raised ValueError outside any collective "
                                     "(after its 1st collective): that exception is the cause")


def _skips_a_backward():
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        if not (dist.get_rank() == 1 and step == 1):
            loss.backward()  # rank 1 skips its 2nd backward
    dist.barrier()


def test_a_skipped_ddp_backward_shows_in_the_counts_per_call_site():
    report = _fail(_skips_a_backward, 2, timeout=10, pg_timeout=4).desync
    assert report.first_difference is not None
    assert "Counted per call site, the ranks differ: from _skips_a_backward, line" in (
        report.summary)
    assert "(backward): rank 0 issued 3, rank 1 issued 2" in report.summary


def test_on_nccl_the_report_says_it_does_not_cover_it():
    traces = [RankTrace(r, _calls("all_reduce 3"), "still running") for r in range(2)]
    report = build(traces, backend="nccl")
    assert report.summary.startswith("This report does not cover NCCL yet")
    assert "no desync" not in report.summary


# -- torch's own checks, and DDP's bucket rebuild (review lessons 06-10: F13, R5) ---------------

DETAIL_ERROR = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: "
                "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[1]), but "
                "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=1, "
                "OpType=BROADCAST, TensorShape=[8]).Collectives differ in the following aspects:"
                "   Op type: ALLREDUCEvs BROADCAST  Tensor Tensor shapes: 1vs 8")


def test_detail_s_mismatch_check_leads_and_is_not_called_outside_a_collective():
    # as under TORCH_DISTRIBUTED_DEBUG=DETAIL (lesson 10): the wrapped group records nothing
    traces = [RankTrace(r, [], "raised RuntimeError", collective_error=True, text=DETAIL_ERROR)
              for r in range(2)]
    report = build(traces)
    assert report.summary.startswith(
        "TORCH_DISTRIBUTED_DEBUG=DETAIL's check found the ranks in different collectives "
        "(rank 0's error): \"Op type: ALLREDUCE vs BROADCAST Tensor Tensor shapes: 1 vs 8\".")
    assert report.raised_outside == [] and "outside any collective" not in report.summary


def _rank_2_misses_the_monitored_barrier():
    if dist.get_rank() == 2:
        time.sleep(30)
    dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)


def test_monitored_barrier_names_the_missing_rank_in_the_report():
    report = _fail(_rank_2_misses_the_monitored_barrier, 3).desync
    assert [(k.rank, k.check) for k in report.torch_checks] == [(0, "monitored_barrier")]
    assert ("monitored_barrier named the rank(s) that never reached it (rank 0's error): "
            "\"Ranks 2 failed to pass monitoredBarrier in 2000 ms\".") in report.summary
    assert report.raised_outside == [] and "outside any collective" not in report.summary


def _stops_one_step_early():
    model = DDP(nn.Linear(4, 1))
    for _ in range(4 - dist.get_rank()):
        model(torch.randn(8, 4)).sum().backward()
    dist.barrier()


def test_ddp_s_bucket_rebuild_broadcasts_are_named_so():
    report = _fail(_stops_one_step_early, 2, pg_timeout=3).desync
    parts = [c.where.rpartition("(")[2] for c in report.traces[0].calls if c.op == "broadcast"]
    assert parts == ["DDP's constructor)"] * 2 + ["DDP's bucket rebuild)"] * 2


def test_scatter_s_root_only_input_is_no_difference():
    """Only the source rank passes scatter's list (as DTensor's distribute_tensor does)."""
    traces = [RankTrace(0, [Call(1, "scatter", ((2, 8, 8),), "f, line 3", "f.py", True)],
                        "raised ValueError"),
              RankTrace(1, [Call(1, "scatter", (), "f, line 3", "f.py", True)],
                        "raised ValueError")]
    assert build(traces).first_difference is None
