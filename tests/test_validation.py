"""Bad input fails at once with a message that says what to do."""

import pytest
import torch

from course_lib import launch
from course_lib.launching.validate import choose_backend

# one rank more than there are GPUs, so that NCCL is refused on any machine
SHORT_OF_GPUS = torch.cuda.device_count() + 1


def ok():
    return 1


@pytest.mark.parametrize("kwargs, error, fragment", [
    ({"world_size": 0}, ValueError, "at least 1"),
    ({"world_size": -2}, ValueError, "at least 1"),
    ({"world_size": 10**6}, ValueError, "more ranks than this machine"),
    ({"world_size": "2"}, TypeError, "must be an int"),
    ({"world_size": 2.0}, TypeError, "must be an int"),
    ({"world_size": True}, TypeError, "must be an int"),
    ({"backend": "mpi"}, ValueError, "backend must be one of"),
    ({"backend": "nccl", "world_size": SHORT_OF_GPUS}, ValueError, "needs one GPU per rank"),
    ({"timeout": 0}, ValueError, "positive number of seconds"),
    ({"timeout": "10"}, ValueError, "positive number of seconds"),
    ({"args": 3}, TypeError, "args=(x,)"),
    ({"kwargs": [1]}, TypeError, "kwargs must be a dict"),
    ({"env": ["A=1"]}, TypeError, "env must be a dict"),
    ({"env": {"RANK": "3"}}, ValueError, "launcher sets"),
    ({"env": {"A": None}}, TypeError, "must be a str or a number"),
    ({"env": {"OMP_NUM_THREADS": "many"}}, ValueError, "whole number"),
    ({"pg_timeout": -1}, ValueError, "pg_timeout must be a positive"),
])
def test_bad_arguments_fail_fast_and_say_why(kwargs, error, fragment):
    with pytest.raises(error, match=None) as info:
        launch(ok, **kwargs)
    assert fragment in str(info.value)


def test_non_callable_is_refused():
    with pytest.raises(TypeError, match="needs a function"):
        launch("train", 2)


def fake_gpus(monkeypatch, count):
    """Make torch report `count` GPUs (0: no CUDA at all), as choose_backend reads them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize("gpus, world_size, backend, says_why", [
    (0, 1, "gloo", False),  # a CPU machine: gloo, and nothing to explain
    (0, 4, "gloo", False),
    (1, 1, "nccl", False),  # one GPU per rank: NCCL
    (1, 2, "gloo", True),   # GPUs short: gloo, with one line saying why
    (2, 4, "gloo", True),
    (8, 4, "nccl", False),
])
def test_auto_backend_says_why_only_when_gpus_are_short(
        monkeypatch, capsys, gpus, world_size, backend, says_why):
    fake_gpus(monkeypatch, gpus)
    assert choose_backend("auto", world_size) == backend
    out = capsys.readouterr().out
    if says_why:
        assert out.count("\n") == 1, out
        assert f"{world_size} ranks need {world_size} GPUs" in out
        assert f"this machine has {gpus}" in out
    else:
        assert out == ""


def test_explicit_backends_say_nothing(monkeypatch, capsys):
    fake_gpus(monkeypatch, 1)
    assert choose_backend("gloo", 2) == "gloo"
    assert choose_backend("nccl", 1) == "nccl"
    with pytest.raises(ValueError, match="needs one GPU per rank"):
        choose_backend("nccl", 2)
    assert capsys.readouterr().out == ""
