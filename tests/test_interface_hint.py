"""A launch with GLOO_SOCKET_IFNAME naming a missing interface says which variable to set."""

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.launching import DistributedError
from course_lib.launching.errors import RankFailure, advice


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


@pytest.mark.parametrize("message", [
    "[pair.cc:553] Connection closed by peer [127.0.0.1]:28037",
    "[unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete",
    "[pair.cc:598] Application timeout caused pair closure",
])
def test_a_peer_caused_failure_sorts_after_a_rank_s_own_error(message):
    own = RankFailure(1, "exception", "", "ValueError", "bad batch at step 3")
    caused = RankFailure(0, "exception", "", "RuntimeError", message)
    assert caused.is_consequence and not own.is_consequence
    assert [f.rank for f in sorted([caused, own], key=lambda f: f.blame)] == [1, 0]
