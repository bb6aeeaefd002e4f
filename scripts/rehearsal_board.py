"""The workshop board's part of scripts/workshop_rehearsal.py (--board-json): the hub config
that starts the board service, each learner's lesson-00 exercise notebook (some answer
wrong first, one stays stuck), the instructor who watches the board in a browser, the HTTP
statuses a stranger and a learner get, the board checked against the learners' saved
notebooks, and the time a check takes with the board on and off."""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat

from course_lib.protocol import CHECK_MIME

SERVICE = "course-board"
INSTRUCTOR = "instructor"
LESSON = "00_welcome.ipynb"
POLL_S = 2.0

# Wrong answers as learners write them (tests/test_checks.py has each one's hint).
WRONG = {
    "summary_own_x": "def rank_summary(x):\n"
                     "    return dist.get_rank(), dist.get_world_size(), x\n",
    "summary_average": "def rank_summary(x):\n"
                       "    total = torch.tensor([x], dtype=torch.float64)\n"
                       "    dist.all_reduce(total)\n"
                       "    return dist.get_rank(), dist.get_world_size(), "
                       "total.item() / dist.get_world_size()\n",
    "random_unsynced": "def same_random(n):\n    return torch.rand(n)\n",
    "random_summed": "def same_random(n):\n    numbers = torch.rand(n)\n"
                     "    dist.all_reduce(numbers)\n    return numbers\n",
    "random_mean": "def same_random(n):\n    numbers = torch.rand(n)\n"
                   "    dist.all_reduce(numbers)\n    return numbers / dist.get_world_size()\n",
}
RIGHT = "right"
# Learner i does PLANS[i % 4]: per exercise function, the answers tried in order.
PLANS = [
    {"rank_summary": [RIGHT], "same_random": [RIGHT]},
    {"rank_summary": ["summary_own_x", RIGHT], "same_random": [RIGHT]},
    {"rank_summary": ["summary_own_x", RIGHT], "same_random": ["random_summed", RIGHT]},
    {"rank_summary": ["summary_average", RIGHT],
     "same_random": ["random_unsynced", "random_summed", "random_mean"]},  # stuck: 3 failures
]
CHECKS = {"rank_summary": "check_rank_summary", "same_random": "check_same_random"}


def hub_config(python: Path, hub_port: int, service_port: int, state: Path) -> str:
    """What docs/hosting.md asks an existing hub to add, for this rehearsal's hub."""
    access = f"access:services!service={SERVICE}"
    return f"""
c.JupyterHub.services = [{{
    "name": "{SERVICE}",
    "url": "http://127.0.0.1:{service_port}",
    "command": [{str(python)!r}, "-m", "course_lib.board.service"],
    "environment": {{"COURSE_BOARD_STATE": {str(state)!r}}},
    "oauth_no_confirm": True,
}}]
c.JupyterHub.load_roles = [{{"name": "user", "scopes": ["self", "{access}"]}}]
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", "{access}"]
c.Spawner.environment = {{"COURSE_BOARD_URL": "http://127.0.0.1:{hub_port}/services/{SERVICE}/"}}
c.Authenticator.admin_users = {{"{INSTRUCTOR}"}}
"""


def learner_notebook(solutions: Path, plan: dict[str, list[str]], path: Path) -> None:
    """Lesson 00's worked exercises, each solution preceded by the wrong answers the plan
    tries first, each answer followed by its check cell."""
    nb = nbformat.read(solutions / LESSON, as_version=4)
    cells, checks = [], set()
    for i, cell in enumerate(nb.cells):
        function = next((f for f in plan if cell.cell_type == "code"
                         and cell.source.startswith(f"def {f}(")), None)
        if i in checks:
            continue
        if function is None:
            cells.append(cell)
            continue
        check = nb.cells[i + 1]  # the exercise's check cell follows its function
        checks.add(i + 1)
        for answer in plan[function]:
            cells += [nbformat.v4.new_code_cell(cell.source if answer == RIGHT else WRONG[answer]),
                      nbformat.v4.new_code_cell(check.source, metadata=check.metadata)]
    nb.cells = cells
    nbformat.write(nb, path)


def expected_rows(names: list[str]) -> dict[tuple[str, str], tuple[bool, int]]:
    """(learner, check) -> (passed, attempts) as the plans say."""
    return {(n, CHECKS[f]): (answers[-1] == RIGHT, len(answers))
            for i, n in enumerate(names) for f, answers in PLANS[i % len(PLANS)].items()}


def notebook_rows(path: Path, learner: str) -> dict[tuple[str, str], tuple[bool, int]]:
    """(learner, check) -> (the last verdict, attempts) as the saved notebook shows them."""
    seen: dict[str, list[bool]] = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for output in cell.get("outputs", []):
            verdict = output.get("data", {}).get(CHECK_MIME)
            if verdict:
                seen.setdefault(verdict["check"], []).append(verdict["passed"])
    return {(learner, c): (v[-1], len(v)) for c, v in seen.items()}


def board_rows(board: dict) -> dict[tuple[str, str], tuple[bool, int]]:
    return {(r["learner"], r["check"]): (r["passed"], r["attempts"]) for r in board["rows"]}


# -- what the rehearsal shows -----------------------------------------------------------------

ROW_KEYS = ("learner", "exercise", "check", "passed", "attempts", "failures", "kind",
                  "kind_label", "first", "last", "stuck")


def shows_what_it_must(result: dict) -> bool:
    """What the rehearsal must show: the board as the notebooks, strangers and learners
    refused, the instructor let in."""
    return (result["board_matches_notebooks"] and result["board_matches_plans"]
            and result["anonymous_status"] == 401 and result["learner_status"] == 403
            and set(result["learner_page_status"].values()) == {403}
            and result["instructor_page_status"] == 200)


def print_result(result: dict) -> None:
    """The board as text: one line per learner and check, then the checks, then statuses."""
    print(f"{result['learners']} learners did {result['lesson']} in {result['learners_s']:.0f} s "
          f"on {result['cores']} cores")
    for r in result["rows"]:
        print(f"  {r['learner']:<10} {r['exercise']} {r['check']:<20} "
              f"{'passed' if r['passed'] else 'not yet':<8} {r['attempts']} attempt(s)"
              f"{'  STUCK: ' + r['stuck'] if r['stuck'] else ''}")
    for c in result["checks"]:
        print(f"  {c['check']}: {c['passed']}/{c['tried']} passed; most common hint "
              f"({c['top_hint_learners']} learners): {c['top_hint_label'] or '-'}")
    print("  statuses: " + ", ".join(f"{k} {result[k]}" for k in (
        "anonymous_status", "learner_status", "learner_page_status", "instructor_page_status")))
    print(f"  board = learners' notebooks: {result['board_matches_notebooks']}, "
          f"= plans: {result['board_matches_plans']}; overhead: {result['overhead']}")


# -- the instructor, in a browser --------------------------------------------------------------

def instructor(hub: str, password: str, stop: multiprocessing.Event,
               out: multiprocessing.Queue, shot: Path) -> None:
    """Log in as the hub's admin, open the board, read its JSON every POLL_S s until `stop`;
    put (timeline, last board, page status) on `out`. Runs in a process of its own."""
    from browser_lab import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    board_url = f"{hub}/services/{SERVICE}/"
    timeline, board, start = [], {}, time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(f"{hub}/hub/login?next=/services/{SERVICE}/")
        page.fill("#username_input", INSTRUCTOR)
        page.fill("#password_input", password)
        page.click("#login_submit")
        page.wait_for_url(f"{board_url}**", timeout=120_000)
        while True:
            stopping = stop.is_set()
            board = page.request.get(board_url + "api/board").json()
            timeline.append({"t": round(time.monotonic() - start, 1),
                             "verdicts": sum(r["attempts"] for r in board["rows"]),
                             "passed": sum(r["passed"] for r in board["rows"]),
                             "stuck": len(board["stuck"])})
            if stopping:
                break
            stop.wait(POLL_S)
        status = page.goto(board_url).status
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    out.put((timeline, board, status))


def learner_page_status(page, hub: str) -> int:
    """What a learner's browser gets for the board page (through the hub's OAuth)."""
    return page.goto(f"{hub}/services/{SERVICE}/").status


def status_of(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"}
                                     if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


# -- the cost of a check with the board on and off ---------------------------------------------

AB_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist
    from course_lib.board import client
    from course_lib.checks.lesson00 import check_rank_summary

    def rank_summary(x):
        total = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(total)
        return dist.get_rank(), dist.get_world_size(), total.item()

    hook, post, real_report, real_post = [], [], client.report, client._post
    def timed_report(*args):
        start = time.perf_counter()
        thread = real_report(*args)
        hook.append(time.perf_counter() - start)
        return thread
    def timed_post(*args):
        start = time.perf_counter()
        real_post(*args)
        post.append(time.perf_counter() - start)
    client.report, client._post = timed_report, timed_post
    check_rank_summary(rank_summary)  # starts the forkserver: not counted
    client.wait()
    seconds = {"on": [], "off": []}
    for i in range(int(sys.argv[1])):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            os.environ["COURSE_BOARD"] = "1" if mode == "on" else "0"
            start = time.perf_counter()
            assert check_rank_summary(rank_summary).passed
            seconds[mode].append(time.perf_counter() - start)
            client.wait()
    print("AB " + json.dumps({"seconds": seconds, "hook": hook[1:], "post": post[1:]}))
""")


def overhead(env: dict[str, str], pairs: int, root: Path) -> dict:
    """Check the right rank_summary `pairs` times with the board on and off, alternating
    which goes first, as the learner whose server environment `env` is (their token,
    COURSE_BOARD_URL): each check's time, the median of the pairs' differences (on - off),
    the hook's own time on the check's thread and the post's on its thread."""
    done = subprocess.run([sys.executable, "-c", AB_SCRIPT, str(pairs)], env=env,
                          cwd=env.get("HOME", root), capture_output=True, text=True, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("AB ")), None)
    raw = json.loads(line[3:]) if line else {}
    if not raw.get("hook") or not raw.get("post"):
        raise RuntimeError(f"the on/off timing failed (no hook or no post timed):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    on, off = raw["seconds"]["on"], raw["seconds"]["off"]
    ms = statistics.median  # of a list of seconds, as milliseconds below
    return {"pairs": pairs, "check_ms": {"on": [round(s * 1000) for s in on],
                                         "off": [round(s * 1000) for s in off]},
            "median_ms": {"on": round(ms(on) * 1000), "off": round(ms(off) * 1000)},
            "paired_difference_median_ms": round(ms([a - b for a, b in zip(on, off)]) * 1000, 1),
            "hook_median_ms": round(ms(raw["hook"]) * 1000, 3),
            "post_median_ms": round(ms(raw["post"]) * 1000, 1),
            "load_average": round(os.getloadavg()[0], 1)}
