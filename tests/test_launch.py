"""launch(): results, environment, output and sockets, through real launches."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from procs import alive

from course_lib import launch
from course_lib.launching import ranks, standby
from course_lib.network import non_loopback, socket_addresses


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_results_come_back_in_rank_order(world_size):
    run = launch(lambda: dist.get_rank() * 10, world_size, backend="gloo", echo=False)
    assert run.results == [r * 10 for r in range(world_size)]
    assert run.world_size == world_size and run.backend == "gloo"


def test_process_group_is_ready_and_collectives_work():
    def total():
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return t.item(), dist.get_world_size(), dist.get_backend()

    assert launch(total, 3, backend="gloo", echo=False).results == [(6.0, 3, "gloo")] * 3


def _environment():
    keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GLOO_SOCKET_IFNAME", "COURSE_GREETING"]
    return {k: os.environ.get(k) for k in keys}, torch.get_num_threads()


def test_torchrun_variables_and_one_thread_by_default():
    run = launch(_environment, 2, backend="gloo", echo=False)
    for rank, (env, threads) in enumerate(run.results):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["GLOO_SOCKET_IFNAME"] in ("lo", "lo0")
        assert threads == 1
    first, second = (env for env, _ in run.results)
    assert (first["MASTER_ADDR"], first["MASTER_PORT"]) == (second["MASTER_ADDR"],
                                                            second["MASTER_PORT"])


def test_env_reaches_every_rank_and_can_ask_for_threads():
    run = launch(_environment, 2, env={"COURSE_GREETING": "hi", "OMP_NUM_THREADS": 2},
                 backend="gloo", echo=False)
    assert [env["COURSE_GREETING"] for env, _ in run.results] == ["hi", "hi"]
    assert [threads for _, threads in run.results] == [2, 2]


def test_arguments_closures_lambdas_and_local_classes():
    class Box:
        def __init__(self, value):
            self.value = value

    offset = 100

    def make(scale, *, extra):
        return Box(dist.get_rank() * scale + offset + extra)

    run = launch(make, 2, args=(3,), kwargs={"extra": 1}, backend="gloo", echo=False)
    assert all(isinstance(b, Box) for b in run.results)
    assert [b.value for b in run.results] == [101, 104]
    run = launch(lambda x: x + dist.get_rank(), 2, args=(5,), backend="gloo", echo=False)
    assert run.results == [5, 6]


def test_output_is_prefixed_live_and_kept(capsys):
    import sys

    def chatty():
        print(f"hello from {dist.get_rank()}")
        print("careful", file=sys.stderr)

    run = launch(chatty, 2, backend="gloo")
    captured = capsys.readouterr()
    assert "[rank 0] hello from 0" in captured.out and "[rank 1] hello from 1" in captured.out
    assert "[rank 1] careful" in captured.err
    assert run.output(1) == "hello from 1\ncareful\n" or run.output(1) == "careful\nhello from 1\n"
    assert "[rank 0] hello from 0" in run.output()


def test_all_output_arrives_though_the_launch_does_not_wait_for_the_exits():
    """A launch returns once every rank has returned and said it is exiting (launcher.
    _all_returned); what the ranks wrote before, more than a pipe holds and a last line
    without its newline, still arrives whole."""

    def loud():
        for i in range(20000):
            print(f"line {i}")
        os.write(2, b"written on fd 2\n")
        print("no newline", end="")
        return dist.get_rank()

    run = launch(loud, 2, backend="gloo", echo=False)
    assert run.results == [0, 1]
    for rank in (0, 1):
        lines = run.output(rank).splitlines()
        assert [line for line in lines if line.startswith("line ")] == [
            f"line {i}" for i in range(20000)]
        assert "written on fd 2" in lines
        assert "no newline" in lines


def test_the_ranks_of_a_finished_launch_are_gone_once_collected():
    run = launch(os.getpid, 2, backend="gloo", echo=False)
    standby.discard()  # collects the last launch's ranks (ranks.collect_retired)
    assert ranks._retired == []
    assert not alive(set(run.results)), "a rank outlived its launch"


def test_twenty_reruns_in_a_row():
    for i in range(20):
        run = launch(lambda i: (dist.get_rank(), i), 2, args=(i,), backend="gloo", echo=False)
        assert run.results == [(0, i), (1, i)]


def test_ranks_hold_no_socket_outside_loopback():
    def sockets():
        t = torch.ones(1)
        dist.all_reduce(t)  # gloo's connections exist now
        return socket_addresses(os.getpid())

    for addresses in launch(sockets, 2, backend="gloo", echo=False).results:
        assert addresses, "expected the rank to hold gloo sockets"
        assert non_loopback(addresses) == []


def test_timings_are_recorded():
    run = launch(lambda: None, 2, backend="gloo", echo=False)
    for t in run.timings:
        assert t["started"] <= t["ready"] <= t["result"]
    assert run.wall_time > 0


def test_the_loopback_check_flags_wildcard_and_outside_addresses():
    addresses = [("LISTEN", "127.0.0.1", 1), ("LISTEN", "0.0.0.0", 2), ("NONE", "::1", 3),
                 ("ESTABLISHED", "10.1.2.3", 4), ("LISTEN", "::", 5)]
    assert [a[2] for a in non_loopback(addresses)] == [2, 4, 5]


def test_each_rank_starts_with_its_own_random_state_like_a_fresh_process():
    import random

    import numpy as np

    def draws():
        return torch.initial_seed(), torch.randn(1).item(), random.random(), np.random.rand()

    first, second = launch(draws, 2, backend="gloo", echo=False).results
    assert all(a != b for a, b in zip(first, second))


def test_debug_level_from_env_reaches_the_process_group():
    def level():
        return str(dist.get_debug_level())

    run = launch(level, 2, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, backend="gloo", echo=False)
    assert run.results == ["DebugLevel.INFO"] * 2
    assert launch(level, 2, backend="gloo", echo=False).results == ["DebugLevel.OFF"] * 2


@pytest.mark.parametrize("inherited, worker, tag", [
    ("abc", "", "abc"),                # plain pytest: the session's own tag
    ("abc", "gw3", "abc-gw3"),         # an xdist worker: the controller's tag, plus its name
    ("abc-gw3", "gw3", "abc-gw3"),     # a process that worker started: the same tag, once
])
def test_each_xdist_worker_tags_its_own_processes(inherited, worker, tag):
    """The leak check counts forkserver processes carrying this process's tag only, so that
    under pytest -n a worker never counts another worker's ranks as left behind."""
    env = {**os.environ, "COURSE_TEST_SESSION": inherited, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run(
        [sys.executable, "-c", "import os, procs; print(os.environ[procs.SESSION_VAR])"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == tag, out.stderr


def test_bad_input_reads_from_its_message_in_ipython():
    """IPython shows _render_traceback_(): the message first, not the launcher's frames."""
    with pytest.raises(ValueError) as info:
        launch(lambda: 1, 0, backend="gloo", echo=False)
    shown = info.value._render_traceback_()
    assert shown[0] == f"ValueError: {str(info.value).splitlines()[0]}"
    assert not any("course_lib" + os.sep in line for line in shown)
