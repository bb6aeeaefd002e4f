"""The workshop board as a JupyterHub service (tornado, with jupyterhub's own HubOAuth):
learners' kernels post verdicts with their hub token, admins read the board.

    python -m course_lib.board.service     # started by the hub: jupyterhub_config.py's
                                           # c.JupyterHub.services entry (docs/hosting.md)

Routes, under the service's prefix (/services/course-board/):
  POST api/verdicts  a learner's token; the learner is the token's owner, never the body
  GET  api/board     admins only, JSON: 401 without a user, 403 for a learner
  GET  (the prefix)  admins only, the page (the hub's OAuth login first)
The state lives in memory, and in the JSON file COURSE_BOARD_STATE when it is set."""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from urllib.parse import urlparse

# jupyterhub ships no types, and is absent where the `hub` extra is not installed.
from jupyterhub.services.auth import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
    HubOAuth,
    HubOAuthCallbackHandler,
    HubOAuthenticated,
    UserNotAllowed,
)
from tornado import ioloop, web

from course_lib.board import labels, page
from course_lib.board.store import Board

NAME = re.compile(r"[\w.-]{1,80}")  # an exercise or a check
KIND = re.compile(r"[\w.:+-]{1,160}")
FIELDS = {"exercise", "check", "passed", "kind"}
MAX_CHECKS_PER_LEARNER = 500  # a bound on what one token can make the service hold


class BoardHandler(HubOAuthenticated, web.RequestHandler):
    """Finds the hub user (token header, or the OAuth cookie) without blocking the loop."""

    def initialize(self, board: Board, hub_auth: HubOAuth) -> None:
        self.board = board
        self.hub_auth = hub_auth

    async def prepare(self) -> None:
        model = await self.hub_auth.get_user(self, sync=False)
        try:
            self.current_user = self.check_hub_user(model) if model else None
        except UserNotAllowed:  # a hub user without access to this service
            raise web.HTTPError(403) from None

    def admin(self) -> dict:
        """The user, when an admin; else 401 (no user) or 403 (a learner)."""
        if not self.current_user:
            raise web.HTTPError(401)
        if self.current_user.get("kind", "user") != "user" or not self.current_user.get("admin"):
            raise web.HTTPError(403, "the board is for the hub's admins")
        return self.current_user


class VerdictHandler(BoardHandler):
    def post(self) -> None:
        """Record one verdict for the token's owner. A token only: a browser's cookie could
        be used by another site's page (cross-site request forgery)."""
        user = self.current_user
        if not user or not getattr(self, "_token_authenticated", False) \
                or user.get("kind", "user") != "user":
            raise web.HTTPError(401, "post with a user's hub token")
        verdict = parse_verdict(self.request.body)
        key = (user["name"], verdict["exercise"], verdict["check"])
        if key not in self.board.entries and sum(
                k[0] == user["name"] for k in self.board.entries) >= MAX_CHECKS_PER_LEARNER:
            raise web.HTTPError(429, "too many checks for one learner")
        self.board.record(user["name"], **verdict)
        self.set_status(204)


class BoardJSONHandler(BoardHandler):
    def get(self) -> None:
        self.admin()
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(labelled(self.board.view())))


class PageHandler(BoardHandler):
    @web.authenticated  # no user: to the hub's login, then back here
    def get(self) -> None:
        self.admin()
        self.write(page.render(labelled(self.board.view())))


class CallbackHandler(HubOAuthCallbackHandler):
    """The end of the hub's OAuth login: sets the cookie, back to the page."""

    def initialize(self, hub_auth: HubOAuth) -> None:
        self.hub_auth = hub_auth


def parse_verdict(body: bytes) -> dict:
    """The four fields a kernel sends, checked; anything else (a learner's name among them)
    is refused with 400."""
    try:
        data = json.loads(body)
    except ValueError:
        raise web.HTTPError(400, "the body is not JSON") from None
    if not isinstance(data, dict) or set(data) != FIELDS:
        raise web.HTTPError(400, f"the body must hold exactly {sorted(FIELDS)}")
    if not (isinstance(data["exercise"], str) and NAME.fullmatch(data["exercise"])
            and isinstance(data["check"], str) and NAME.fullmatch(data["check"])
            and isinstance(data["kind"], str) and KIND.fullmatch(data["kind"])
            and isinstance(data["passed"], bool)):
        raise web.HTTPError(400, "a field has the wrong type or characters")
    return data


def labelled(view: dict) -> dict:
    """The view with each hint kind's readable label beside it."""
    for row in view["rows"]:
        row["kind_label"] = labels.label(row["kind"])
    for check in view["checks"]:
        check["top_hint_label"] = labels.label(check["top_hint"]) if check["top_hint"] else ""
    return view


def make_app(board: Board, hub_auth: HubOAuth, prefix: str) -> web.Application:
    """The routes under `prefix` (the service's, ending in /)."""
    options = {"board": board, "hub_auth": hub_auth}
    return web.Application([
        (prefix, PageHandler, options),
        (prefix + "api/board", BoardJSONHandler, options),
        (prefix + "api/verdicts", VerdictHandler, options),
        (prefix + "oauth_callback", CallbackHandler, {"hub_auth": hub_auth}),
        (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}),
    ], cookie_secret=secrets.token_bytes(32))


def main() -> None:
    """Serve at the URL the hub gave this service (JUPYTERHUB_SERVICE_URL)."""
    state = os.environ.get("COURSE_BOARD_STATE")
    board = Board(Path(state) if state else None)
    hub_auth = HubOAuth(api_token=os.environ["JUPYTERHUB_API_TOKEN"], cache_max_age=60)
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    make_app(board, hub_auth, os.environ["JUPYTERHUB_SERVICE_PREFIX"]).listen(
        url.port or 80, url.hostname or "127.0.0.1")
    print(f"course board at {url.geturl()}, state: {state or 'in memory only'}", flush=True)
    try:
        ioloop.IOLoop.current().start()
    except KeyboardInterrupt:  # the hub stops its services with SIGINT
        pass


if __name__ == "__main__":
    main()
