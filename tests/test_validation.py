"""Bad input fails at once with a message that says what to do."""

import pytest
import torch

from course_lib import launch

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
