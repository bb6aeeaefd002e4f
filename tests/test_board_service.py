"""The board service's rules (course_lib/board/service.py), through jupyterhub's own HubOAuth
and tornado, with a stand-in for the hub's answer to "whose token is this?": only admins
read the board (401 anonymous, 403 a learner), a verdict is recorded for the token's owner
and never for a name in the body, and a browser cookie cannot post. Plus the store's rules
(attempts, stuck, most common hint, the JSON file) and the labels."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

pytest.importorskip("jupyterhub", reason="the hub side needs the `hub` extra (jupyterhub)")

from jupyterhub.services.auth import HubOAuth
from tornado import web
from tornado.testing import AsyncHTTPTestCase

from course_lib.board import labels
from course_lib.board.service import make_app
from course_lib.board.store import Board, Entry

ACCESS = "access:services!service=course-board"
USERS = {  # token -> what the hub's /hub/api/user answers for it
    "ada": {"kind": "user", "name": "ada", "admin": False, "scopes": [ACCESS]},
    "bob": {"kind": "user", "name": "bob", "admin": False, "scopes": [ACCESS]},
    "teacher": {"kind": "user", "name": "teacher", "admin": True, "scopes": ["access:services"]},
    "outsider": {"kind": "user", "name": "eve", "admin": False, "scopes": []},
    "svc": {"kind": "service", "name": "other", "scopes": [ACCESS]},
}


def raise_site(module: str, function: str) -> str:
    """The kind common.raised_at gives the first `raise Rejected(` of a check function,
    counted from its `def` line (it has no decorator)."""
    source = (labels.CHECKS / f"{module}.py").read_text().splitlines()
    first = next(i for i, line in enumerate(source) if line.startswith(f"def {function}("))
    offset = next(i for i, line in enumerate(source[first:]) if "raise Rejected(" in line)
    return f"{module}:{function}+{offset}"


VERDICT = {"exercise": "00", "check": "check_rank_summary", "passed": False,
           "kind": raise_site("lesson00", "_judge_summary")}


class FakeHubAuth(HubOAuth):
    """HubOAuth with the hub's token lookup answered from USERS (the rest is jupyterhub's)."""

    async def _check_hub_authorization(self, url, api_token, cache_key=None, use_cache=True):
        return dict(USERS[api_token]) if api_token in USERS else None


class ServiceTest(AsyncHTTPTestCase):
    def get_app(self):
        self.board = Board()
        self.auth = auth = FakeHubAuth(api_token="service-token", api_url="http://127.0.0.1:9/hub/api",
                           oauth_client_id="service-course-board", access_scopes={ACCESS},
                           oauth_redirect_uri="http://hub/services/course-board/oauth_callback",
                           login_url="http://hub/hub/api/oauth2/authorize")
        return make_app(self.board, auth, "/services/course-board/")

    def call(self, path, token=None, body=None, headers=None):
        headers = dict(headers or {})
        if token:
            headers["Authorization"] = f"token {token}"
        return self.fetch(f"/services/course-board/{path}", method="POST" if body else "GET",
                          body=json.dumps(body) if isinstance(body, dict) else body,
                          headers=headers, follow_redirects=False)

    def test_only_admins_read_the_board(self):
        assert self.call("api/board").code == 401
        assert self.call("api/board", "ada").code == 403
        assert self.call("api/board", "outsider").code == 403
        assert self.call("api/board", "svc").code == 403
        assert self.call("api/board", "teacher").code == 200

    def test_the_page_sends_strangers_to_the_hub_login_and_refuses_learners(self):
        anonymous = self.call("")
        assert anonymous.code == 302
        assert anonymous.headers["Location"].startswith("http://hub/hub/api/oauth2/authorize")
        assert self.call("", "ada").code == 403
        page = self.call("", "teacher")
        assert page.code == 200 and b"Workshop board" in page.body

    def test_a_verdict_counts_for_the_tokens_owner_only(self):
        assert self.call("api/verdicts", "ada", VERDICT).code == 204
        assert list(self.board.entries) == [("ada", "00", "check_rank_summary")]
        as_bob = self.call("api/verdicts", "ada", {**VERDICT, "learner": "bob"})
        assert as_bob.code == 400
        assert list(self.board.entries) == [("ada", "00", "check_rank_summary")]

    def test_no_token_no_verdict(self):
        assert self.call("api/verdicts", None, VERDICT).code == 401
        assert self.call("api/verdicts", "nobody-knows-this", VERDICT).code == 401
        assert self.call("api/verdicts", "outsider", VERDICT).code == 403
        assert self.call("api/verdicts", "svc", VERDICT).code == 401
        assert self.board.entries == {}

    def test_a_browser_cookie_cannot_post(self):
        """The OAuth cookie identifies the admin in a browser; it is not accepted for a post
        (another site's page could send it)."""
        secret = self._app.settings["cookie_secret"]
        cookie = web.create_signed_value(secret, self.auth.cookie_name, "teacher").decode()
        headers = {"Cookie": f"{self.auth.cookie_name}={cookie}"}
        assert self.call("api/board", headers=headers).code == 200  # the cookie is good
        assert self.call("api/verdicts", None, VERDICT, headers).code == 401
        assert self.board.entries == {}

    def test_malformed_verdicts_are_refused(self):
        for body in (b"not json", {**VERDICT, "passed": "yes"}, {**VERDICT, "check": "a b"},
                     {k: v for k, v in VERDICT.items() if k != "kind"},
                     {**VERDICT, "kind": "<script>"}):
            assert self.call("api/verdicts", "ada", body).code == 400, body
        assert self.board.entries == {}

    def test_the_json_holds_what_was_posted(self):
        self.call("api/verdicts", "ada", VERDICT)
        self.call("api/verdicts", "ada", {**VERDICT, "passed": True, "kind": "pass"})
        self.call("api/verdicts", "bob", VERDICT)
        board = json.loads(self.call("api/board", "teacher").body)
        rows = {r["learner"]: r for r in board["rows"]}
        assert (rows["ada"]["attempts"], rows["ada"]["passed"]) == (2, True)
        assert (rows["bob"]["attempts"], rows["bob"]["passed"]) == (1, False)
        [check] = board["checks"]
        assert (check["top_hint"], check["top_hint_learners"]) == (VERDICT["kind"], 2)
        assert check["top_hint_label"].startswith("with {n} ranks")


def test_stuck_after_three_failures_or_ten_minutes_and_never_once_passed():
    board = Board()
    for _ in range(3):
        board.record("ada", "00", "a", False, "k1", now=100.0)
    board.record("bob", "00", "a", False, "k1", now=100.0)
    board.record("cy", "00", "a", False, "k2", now=100.0)
    board.record("cy", "00", "a", True, "pass", now=200.0)
    board.record("cy", "00", "a", False, "k2", now=300.0)
    view = board.view(now=100.0 + 599)
    assert [(s["learner"], s["stuck"]) for s in view["stuck"]] == [("ada", "3 failed attempts")]
    view = board.view(now=100.0 + 600)
    assert [(s["learner"], s["stuck"]) for s in view["stuck"]] == [
        ("ada", "3 failed attempts"), ("bob", "10 min without a pass")]


def test_the_most_common_hint_counts_learners_before_attempts():
    board = Board()
    for _ in range(5):
        board.record("ada", "00", "a", False, "often-by-one")
    board.record("bob", "00", "a", False, "by-two")
    board.record("cy", "00", "a", False, "by-two")
    [check] = board.view()["checks"]
    assert (check["top_hint"], check["top_hint_learners"], check["top_hint_attempts"]) == (
        "by-two", 2, 2)


def test_the_state_file_survives_a_restart(tmp_path):
    path = tmp_path / "board.json"
    Board(path).record("ada", "00", "a", False, "k", now=1.0)
    again = Board(path)
    assert again.entries[("ada", "00", "a")] == Entry(
        "ada", "00", "a", False, "k", 1, 1, 1.0, 1.0, None, {"k": 1})


def test_a_raise_site_reads_as_its_hint_template():
    """The label comes from the checks' source, not from a learner: placeholders stay."""
    text = labels.label(raise_site("lesson00", "_judge_summary"))
    assert text == ("with {n} ranks, rank {rank} reported rank={got_rank!r}: ask "
                    "dist.get_rank().")
    assert labels.label("pass") == "passed"
    assert labels.label("lesson00:no_such_function+3") == "lesson00:no_such_function+3"
    assert labels.label("../../etc:passwd+1") == "../../etc:passwd+1"


def test_pages_escape_what_learners_control(tmp_path):
    from course_lib.board import page
    from course_lib.board.service import labelled

    board = Board()
    board.record("<b>ada</b>", "00", "x", False, "k", now=time.time())
    html = page.render(labelled(board.view()))
    assert "<b>ada</b>" not in html and "&lt;b&gt;ada&lt;/b&gt;" in html


def test_the_service_imports_no_torch_and_no_check():
    """It runs on the hub, which needs no torch: labels read the checks' source instead."""
    code = ("import sys, course_lib.board.service, course_lib.board.labels as l; "
            "l.label('lesson00:_judge_totals+10'); print(sorted(sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    loaded = set(json.loads(done.stdout.replace("'", '"')))
    assert "torch" not in loaded and not any(m.startswith("course_lib.checks") for m in loaded)
