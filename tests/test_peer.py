"""doctor --peer / --listen: a multi-node reachability check that names the problem."""

import subprocess
import sys
import time

from course_lib import doctor
from course_lib import network as peer
from course_lib.teach.torchrun import free_ports


def test_both_ways_pass_with_a_listener():
    port = free_ports(1)[0]
    listener = subprocess.Popen([sys.executable, "-m", "course_lib", "doctor", "--listen",
                                 str(port), "--wait", "20"], stdout=subprocess.PIPE, text=True)
    try:
        result = peer.probe("127.0.0.1", port, wait=15)
        out, _ = listener.communicate(timeout=30)
    finally:
        listener.kill()
    assert result.ok and "both ways work" in result.detail and "interface lo" in result.detail
    assert listener.returncode == 0 and "this node reached it back" in out


def test_nobody_listening_is_named_within_the_wait():
    port = free_ports(1)[0]
    start = time.monotonic()
    result = peer.probe("127.0.0.1", port, wait=1)
    assert not result.ok and f"nothing listens on 127.0.0.1:{port}" in result.detail
    assert time.monotonic() - start < 5


def test_an_unknown_host_and_a_bad_argument_are_named(capsys):
    assert "cannot resolve 'no-such-node.invalid'" in peer.probe("no-such-node.invalid", 1).detail
    assert doctor.main(["--peer", "node0"]) == 1
    assert "--peer wants HOST:PORT" in capsys.readouterr().out


def test_something_else_on_the_port_is_reported_as_untested_way_back():
    import socket
    with socket.create_server(("127.0.0.1", 0)) as other:
        port = other.getsockname()[1]
        result = peer.probe("127.0.0.1", port, wait=2)
    assert result.ok and "the way back was not tested" in result.detail


def test_a_listener_nobody_calls_gives_up(capsys):
    assert doctor.main(["--listen", str(free_ports(1)[0]), "--wait", "0.5"]) == 1
    assert "no peer connected" in capsys.readouterr().out
