"""A launch with GLOO_SOCKET_IFNAME naming a missing interface says which variable to set."""

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.launching import DistributedError
from course_lib.launching.report import RankFailure, advice


def _all_reduce_one():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def test_a_missing_interface_gets_the_variable_to_set():
    with pytest.raises(DistributedError) as info:
        launch(_all_reduce_one, 2, env={"GLOO_SOCKET_IFNAME": "eth9"}, timeout=60)
    message = str(info.value)
    assert "Unable to find address for: eth9" in message  # gloo's own error, kept
    assert "GLOO_SOCKET_IFNAME" in message.split("---")[0]  # the fix, before the ranks' details
    assert "no interface named 'eth9'" in message


def test_other_failures_get_no_interface_advice():
    failure = RankFailure(0, "exception", "RuntimeError: boom", "RuntimeError", "boom")
    assert advice([failure]) == ""
    gloo = RankFailure(1, "exception", "", "RuntimeError",
                       "[enforce fail at device.cc:84] ifa != nullptr. Unable to find "
                       "address for: ens5")
    assert "'ens5'" in advice([failure, gloo])
