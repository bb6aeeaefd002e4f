"""The kernel's side of the workshop board (course_lib/board/client.py): nothing is sent
outside a hub or with COURSE_BOARD=0; inside, the four fields go with the learner's token;
a failing or slow board never delays or changes a check's verdict, and says so in one line.
Every endpoint here is a local HTTP server or a closed port: no network."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from course_lib.board import client


class Recorder(http.server.BaseHTTPRequestHandler):
    """Keeps each request it gets; sleeps `delay` s first, answers `status`."""

    received: list[tuple[str, dict, dict]] = []
    delay = 0.0
    status = 204

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.path, dict(self.headers), body))
        time.sleep(self.delay)
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def board(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Recorder]]:
    """A local board endpoint, and a kernel environment inside a hub that points at it."""
    handler = type("Handler", (Recorder,), {"received": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "ada-token")
    monkeypatch.setenv("COURSE_BOARD_URL", f"http://127.0.0.1:{server.server_port}/svc/")
    monkeypatch.delenv("COURSE_BOARD", raising=False)
    monkeypatch.setattr(client, "_warned", threading.Event())
    yield handler
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def not_callable_check():
    """A real @check whose verdict needs no ranks: it refuses a value that is not a function."""
    from course_lib.checks.lesson00 import check_rank_summary

    return check_rank_summary(42)


def test_a_verdict_goes_with_the_learners_token_and_four_fields_only(board):
    thread = client.report("course_lib.checks.lesson10.skip", "check_skip", False,
                           "lesson10.skip:_judge+14")
    thread.join(5)
    [(path, headers, body)] = board.received
    assert path == "/svc/api/verdicts" and headers["Authorization"] == "token ada-token"
    assert body == {"exercise": "10", "check": "check_skip", "passed": False,
                    "kind": "lesson10.skip:_judge+14"}


@pytest.mark.parametrize("env", [{"JUPYTERHUB_API_TOKEN": None},
                                 {"COURSE_BOARD_URL": None},
                                 {"COURSE_BOARD": "0"}])
def test_nothing_is_sent_outside_a_hub_or_when_turned_off(board, monkeypatch, env):
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    assert client.report("course_lib.checks.lesson00", "check_rank_summary", True, "pass") is None
    time.sleep(0.2)
    assert board.received == []


def test_a_check_reports_its_verdict_through_the_hook(board, capsys):
    result = not_callable_check()
    client.wait()
    assert not result.passed
    assert [body for _, _, body in board.received] == [
        {"exercise": "00", "check": "check_rank_summary", "passed": False,
         "kind": "not-callable"}]


def test_a_slow_board_does_not_delay_the_check_and_costs_one_line(board, capsys):
    board.delay = 3 * client.TIMEOUT_S
    start = time.monotonic()
    result = not_callable_check()
    returned = time.monotonic() - start
    client.wait()
    err = capsys.readouterr().err
    assert not result.passed and returned < 1.0, returned
    assert err.count("workshop board") == 1 and "TimeoutError" in err


def test_a_dead_board_costs_one_line_per_kernel_whatever_the_number_of_checks(board,
                                                                          monkeypatch, capsys):
    monkeypatch.setenv("COURSE_BOARD_URL", f"http://127.0.0.1:{closed_port()}/")
    for _ in range(3):
        client.report("course_lib.checks.lesson00", "check_rank_summary", True, "pass")
        client.wait()
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "your check's result above stands" in captured.err


def test_a_refused_post_is_one_line_too(board, capsys):
    board.status = 500
    client.report("course_lib.checks.lesson00", "check_rank_summary", True, "pass").join(5)
    assert capsys.readouterr().err.count("workshop board") == 1


def test_outside_a_hub_the_check_result_is_unchanged(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    result = not_callable_check()
    assert (result.check, result.passed, result.kind) == ("check_rank_summary", False,
                                                          "not-callable")
    assert "expects your function itself" in result.message


def test_exercise_names_come_from_the_check_module():
    assert client.exercise_of("course_lib.checks.lesson03") == "03"
    assert client.exercise_of("course_lib.checks.lesson14.main_check") == "14"
    assert client.exercise_of("course_lib.checks.collectives") == "collectives"


def test_the_client_imports_nothing_heavy():
    """The checks import it: no torch, no jupyterhub, no tornado, no course_lib part."""
    code = "import sys, course_lib.board.client as c; print(sorted(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    loaded = set(json.loads(done.stdout.replace("'", '"')))
    assert not {"torch", "jupyterhub", "tornado", "course_lib.checks"} & loaded
    assert {m for m in loaded if m.startswith("course_lib")} == {
        "course_lib", "course_lib.board", "course_lib.board.client"}
