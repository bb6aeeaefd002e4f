"""The rank record (launching/rank_record.py): what a rank knew comes home by one channel,
whether it returned, was stopped or was killed; each door broken here says so in one
`course_lib warning:` line, and what could be kept is kept."""

import os
import pickle
import signal
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from course_lib import DistributedError, launch
from course_lib.collectors import journal, register_collector
from course_lib.launching.rank_record import journal_path, read

WARNING = "course_lib warning:"


def _fail(fn, **kwargs) -> DistributedError:
    with pytest.raises(DistributedError) as info:
        launch(fn, 2, backend="gloo", echo=False, **kwargs)
    return info.value


def _warnings(run, rank: int) -> list[str]:
    return [line for line in run.output(rank).splitlines() if line.startswith(WARNING)]


def _collects_then_hangs():
    steps = [dist.get_rank()]
    register_collector("steps", lambda: list(steps))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # blocks: rank 1 never comes
    while True:
        time.sleep(0.05)


@pytest.mark.parametrize("desync_report", [True, False])
def test_a_stopped_rank_leaves_its_last_words_with_or_without_the_flight_recorder(
        desync_report):
    """Rank 0 blocked inside gloo, rank 1 in Python: both answer the launcher's stop."""
    err = _fail(_collects_then_hangs, timeout=4, pg_timeout=30, desync_report=desync_report)
    assert err.timed_out and (err.desync is not None) == desync_report
    assert err.run.extras == [{"steps": [0]}, {"steps": [1]}]


def _journals_then_rank_1_dies():
    journal("steps", 0)
    journal("steps", 1)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # no result, no last words: only the journal
    return "done"


def test_what_a_killed_rank_journaled_comes_home_and_the_other_s_result_too():
    err = _fail(_journals_then_rank_1_dies)
    assert err.failures[0].error_type == "SIGKILL"
    assert err.run.extras == [{"steps": [0, 1]}, {"steps": [0, 1]}]
    assert err.run.results == ["done", None] and err.run.returned == [0]


def _journals_an_unpicklable_value_then_dies():
    journal("steps", lambda: 0)  # plain pickle refuses a lambda
    journal("steps", 1)
    journal("steps", lambda: 2)
    journal("steps", 3)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_value_that_cannot_be_journaled_is_one_warning_and_the_rest_come_home():
    err = _fail(_journals_an_unpicklable_value_then_dies)
    for rank in (0, 1):
        assert err.run.extras[rank] == {"steps": [1, 3]}
        warned = _warnings(err.run, rank)
        assert len(warned) == 1 and "'steps' could not be journaled" in warned[0], warned


def _a_collector_fails(then_hang: bool):
    register_collector("good", lambda: "kept")
    register_collector("bad", lambda: 1 / 0)
    while then_hang:
        time.sleep(0.05)
    return dist.get_rank()


@pytest.mark.parametrize("stopped", [False, True], ids=["returned", "stopped"])
def test_a_failing_collector_is_a_warning_and_the_others_come_home(stopped):
    if stopped:
        run = _fail(_a_collector_fails, args=(True,), timeout=3).run
    else:
        run = launch(_a_collector_fails, 2, args=(False,), backend="gloo", echo=False)
        assert run.results == [0, 1]
    assert run.extras == [{"good": "kept"}, {"good": "kept"}]
    for rank in (0, 1):
        warned = _warnings(run, rank)
        assert len(warned) == 1 and "'bad' data could not be sent back (ZeroDivisionError" in (
            warned[0]), warned


def _last_words_cannot_be_written():
    from course_lib.launching import rank_record

    def full_disk() -> bytes:
        raise OSError(28, "No space left on device")

    rank_record.snapshot = full_disk  # what the stop signal's thread calls
    journal("steps", dist.get_rank())
    while True:
        time.sleep(0.05)


def test_last_words_that_cannot_be_written_are_a_warning_and_the_journal_remains():
    run = _fail(_last_words_cannot_be_written, timeout=3).run
    assert run.extras == [{"steps": [0]}, {"steps": [1]}]
    for rank in (0, 1):
        warned = _warnings(run, rank)
        assert len(warned) == 1 and "last words could not be written (OSError" in warned[0]


# -- the kernel's side, on files made here ------------------------------------------------------

def test_a_journal_cut_short_keeps_the_values_before_the_cut(tmp_path, capsys):
    path = str(tmp_path / "extras0")
    with open(journal_path(path), "wb") as f:
        f.write(pickle.dumps(("steps", 0)) + pickle.dumps(("steps", 1))[:-3])
    assert read(0, None, path) == {"steps": [0]}
    assert f"{WARNING} rank 0's journal could not be read past 1 value(s)" in (
        capsys.readouterr().err)


def test_a_snapshot_beats_the_journal_name_by_name_and_a_bad_value_is_a_warning(
        tmp_path, capsys):
    path = str(tmp_path / "extras0")
    with open(journal_path(path), "wb") as f:
        f.write(pickle.dumps(("steps", 0)) + pickle.dumps(("events", "e")))
    sent = pickle.dumps({"steps": cloudpickle.dumps([0, 1]), "bad": b"not a pickle"})
    assert read(0, sent, path) == {"steps": [0, 1], "events": ["e"]}
    assert f"{WARNING} rank 0's 'bad' data could not be read back" in capsys.readouterr().err
