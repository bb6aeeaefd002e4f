"""The kernel's side of the workshop board: after a check, post what it decided to the board
service, with the learner's own hub token. Standard library only: every check imports it.

Posts only inside a JupyterHub single-user server whose hub runs the board: the hub gives
the server JUPYTERHUB_API_TOKEN, and its config gives COURSE_BOARD_URL (docs/hosting.md).
COURSE_BOARD=0 turns it off (read at each check: `%env COURSE_BOARD=0` in a notebook works).
What is sent: the exercise, the check's name, passed or not and the hint's kind; never the
learner's code, values or the hint's text. The post runs on a daemon thread with a 2 s
timeout, so the check returns its verdict at once; a failed post prints one line to stderr,
once per process, and later failures stay silent."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import urllib.request

TIMEOUT_S = 2.0
ENDPOINT = "api/verdicts"  # under COURSE_BOARD_URL
_pending: list[threading.Thread] = []
_warned = threading.Event()


def board_url() -> str | None:
    """Where to post, or None when nothing should be sent: outside a hub, on a hub without
    the board, or with COURSE_BOARD=0."""
    if os.environ.get("COURSE_BOARD", "1").strip() in ("0", "off", "false", "no"):
        return None
    if not os.environ.get("JUPYTERHUB_API_TOKEN"):
        return None
    url = os.environ.get("COURSE_BOARD_URL", "").strip()
    return url.rstrip("/") + "/" if url else None


def exercise_of(module: str) -> str:
    """The exercise a check module belongs to: "course_lib.checks.lesson10.skip" -> "10"."""
    found = re.search(r"lesson(\d+)", module)
    return found.group(1) if found else module.rpartition(".")[2]


def report(module: str, check: str, passed: bool, kind: str) -> threading.Thread | None:
    """Post one verdict in the background; returns the posting thread, or None when nothing
    is sent. Never raises, never waits."""
    url = board_url()
    if url is None:
        return None
    body = {"exercise": exercise_of(module), "check": check, "passed": bool(passed),
            "kind": kind}
    thread = threading.Thread(target=_post, args=(url + ENDPOINT, body), daemon=True,
                              name="course-board-post")
    _pending[:] = [t for t in _pending if t.is_alive()] + [thread]
    thread.start()
    return thread


def wait(timeout: float = 2 * TIMEOUT_S) -> None:
    """Let the posts still under way finish (a script that exits right after a check)."""
    for thread in list(_pending):
        thread.join(timeout)


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"token {os.environ.get('JUPYTERHUB_API_TOKEN', '')}",
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            response.read()
    except Exception as error:  # noqa: BLE001 - any failure ends in the one line below
        if not _warned.is_set():
            _warned.set()
            print(f"(workshop board: this verdict was not sent ({type(error).__name__}); "
                  "your check's result above stands)", file=sys.stderr)
