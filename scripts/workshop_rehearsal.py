"""A workshop, really run: a JupyterHub on this machine (local spawner, configurable-http-proxy
from npm, dummy login), N learners who log in with a browser (Playwright, Debian's
chromium) and each Run All one lesson at the same time; then each learner's CPU-seconds,
peak memory, Run All time and gate verdict. CPU-seconds include the learner's server
starting and the lesson opening.

    .venv/bin/python scripts/workshop_rehearsal.py --lessons 06 08 13 14 [--json OUT]
    .venv/bin/python scripts/workshop_rehearsal.py --board-json BOARD.json [--learners 4]

With --board-json, the hub also runs the workshop board (course_lib/board) and every learner
does lesson 00's exercises instead, some answering wrong first (scripts/rehearsal_board.py
has the plans), while an instructor watches the board in a browser; BOARD.json gets the
board's rows, the statuses a stranger and a learner got from it, the board checked against
the learners' saved notebooks, and a check's time with the board on and off.

Needs root or a writable /tmp, chromium (scripts/install-browser.sh), node and npm. It
installs jupyterhub into .venv and configurable-http-proxy into .hub/ (both gitignored)
when missing. Every learner gets a copy of the course in a home folder of their own under a
temporary folder, as a hub that clones the course per user would give them.
SimpleLocalProcessSpawner runs every learner as this user, without limits: the figures are
what one learner uses, not what a quota allows. Memory is the peak, over the run, of the
learner's processes (server, kernel, forkserver, ranks, DataLoader workers) summed: PSS
(what a memory cgroup would be charged, about) and RSS (an upper bound)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # browser_lab: the browser check's page actions
import rehearsal_board as board_part  # noqa: E402 - beside this script (sys.path[0])
from browser_lab import free_port  # noqa: E402 - importable once tests/ is on the path
from rehearsal_meter import Meter, server_tree  # noqa: E402 - beside this script

VENV = ROOT / ".venv" / "bin"
CHP = ROOT / ".hub" / "node_modules" / ".bin" / "configurable-http-proxy"
PASSWORD = "rehearsal"
RUN_ALL_TIMEOUT_MS = 900_000


def install() -> None:
    """jupyterhub into .venv (the single-user server comes with it), the proxy into .hub/."""
    if not (VENV / "jupyterhub-singleuser").exists():
        subprocess.run([VENV / "python", "-m", "pip", "install", "--quiet", "jupyterhub"],
                       check=True)
    if not CHP.exists():
        if shutil.which("npm") is None:
            sys.exit("workshop rehearsal: configurable-http-proxy needs node and npm "
                     "(apt-get install nodejs npm)")
        subprocess.run(["npm", "install", "--silent", "--prefix", ROOT / ".hub",
                        "configurable-http-proxy"], check=True)


def hub_config(work: Path, port: int, extra: str = "") -> Path:
    """The rehearsal's hub; `extra` is appended (the board's service and settings)."""
    config = work / "jupyterhub_config.py"
    config.write_text(f"""
c.JupyterHub.bind_url = "http://127.0.0.1:{port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.ConfigurableHTTPProxy.pid_file = {str(work / 'proxy.pid')!r}
c.JupyterHub.db_url = "sqlite:///{work / 'hub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(work / 'cookie_secret')!r}
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {str(work / 'home' / '{username}')!r}
c.Spawner.cmd = [{str(VENV / 'jupyterhub-singleuser')!r}]
c.Spawner.args = ["--allow-root"]
c.Spawner.default_url = "/lab/tree/notebooks/00_welcome.ipynb"
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
""" + extra)
    return config


def wait_for(url: str, timeout: float = 120) -> None:
    """Until `url` answers 2xx."""
    def answers() -> bool:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except OSError:
            return False

    wait_until(answers, timeout, url)


def wait_until(ready: Callable[[], bool], timeout: float = 120, what: str = "the board") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"{what} was not ready within {timeout} s")


def learner_home(work: Path, name: str) -> Path:
    """The learner's own copy of the course."""
    home = work / "home" / name
    for folder in ("notebooks", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, home / folder)
    return home


def learner(hub: str, name: str, notebook: str, home: Path, results: multiprocessing.Queue,
            board: bool = False) -> None:
    """One learner: log in, open the notebook (relative to their home), Run All, save; with
    the board, then open its page too (a learner must be refused). Runs in a process of its
    own."""
    import nbformat
    from browser_lab import CHROMIUM, CHROMIUM_ARGS, open_notebook, run_all, saved_notebook
    from playwright.sync_api import sync_playwright

    path = home / notebook
    cells = len(nbformat.read(path, as_version=4).cells)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(f"{hub}/hub/login")
        page.fill("#username_input", name)
        page.fill("#password_input", PASSWORD)
        page.click("#login_submit")
        page.wait_for_url(f"**/user/{name}/lab/**", timeout=300_000)
        start = time.monotonic()
        open_notebook(page, f"{hub}/user/{name}/lab/tree/{notebook}", cells, timeout_ms=300_000)
        run_all(page, RUN_ALL_TIMEOUT_MS)
        seconds = time.monotonic() - start
        saved_notebook(page, path)
        page.screenshot(path=str(home / "page.png"))
        status = board_part.learner_page_status(page, hub) if board else None
        browser.close()
    results.put((name, seconds, status))


def gate(notebook: Path) -> tuple[bool, str]:
    out = subprocess.run([VENV / "python", "-m", "course_lib", "gate", "--executed", notebook],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    return out.returncode == 0, out.stdout.strip().splitlines()[-1] if out.stdout else out.stderr


@contextmanager
def running_hub(work: Path, extra: str = "", port: int | None = None) -> Iterator[str]:
    """A JupyterHub on this machine for the block's duration; yields its URL."""
    port = port or free_port()
    with open(work / "hub.log", "w") as log:
        hub = subprocess.Popen([VENV / "jupyterhub", "-f", hub_config(work, port, extra)],
                               cwd=work, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(f"http://127.0.0.1:{port}/hub/api")
            yield f"http://127.0.0.1:{port}"
        finally:
            hub.terminate()
            hub.wait(timeout=60)
            print(f"hub log and learners' homes (screenshots): {work}")


def rehearse(lessons: list[str]) -> list[dict]:
    names = [f"learner{i + 1}" for i in range(len(lessons))]
    files = {n: "notebooks/" + next(p.name for p in (ROOT / "notebooks").glob(f"{lesson}_*.ipynb"))
             for n, lesson in zip(names, lessons)}
    work = Path(tempfile.mkdtemp(prefix="course-hub-"))
    homes = {n: learner_home(work, n) for n in names}
    with running_hub(work) as hub:
        times, _, meter = run_learners(hub, files, homes)
    rows = []
    for n in names:
        passed, verdict = gate(homes[n] / files[n]) if n in times else (False, "no run")
        rows.append({"learner": n, "lesson": Path(files[n]).name,
                     "run_all_s": round(times.get(n, 0), 1),
                     "cpu_s": round(meter.cpu_seconds(n), 1),
                     "peak_pss_gib": round(meter.peak[n] / 2**30, 2),
                     "peak_rss_gib": round(meter.peak_rss[n] / 2**30, 2), "gate": passed,
                     "verdict": verdict})
    return rows


def run_learners(hub: str, files: dict[str, str], homes: dict[str, Path], board: bool = False
                 ) -> tuple[dict[str, float], dict[str, int | None], Meter]:
    """Every learner at once, each in a process of its own, metered until all are done:
    each one's Run All seconds and (with the board) the status its board page got."""
    results: multiprocessing.Queue = multiprocessing.Queue()
    meter = Meter(list(files))
    procs = [multiprocessing.Process(target=learner,
                                     args=(hub, n, files[n], homes[n], results, board))
             for n in files]
    for proc in procs:
        proc.start()
    while any(proc.is_alive() for proc in procs):
        meter.sample()
        time.sleep(0.5)
    got = [results.get_nowait() for _ in range(results.qsize())]
    return {n: s for n, s, _ in got}, {n: status for n, _, status in got}, meter


def rehearse_board(learners: int, pairs: int) -> dict:
    """N learners do lesson 00's exercises on a hub that runs the board, an instructor
    watches it; what the board showed, checked against the learners' own notebooks."""
    names = [f"learner{i + 1}" for i in range(learners)]
    notebook = f"exercises/{board_part.LESSON}"
    work = Path(tempfile.mkdtemp(prefix="course-hub-"))
    homes = {n: learner_home(work, n) for n in names}
    for i, n in enumerate(names):
        board_part.learner_notebook(ROOT / "solutions", board_part.PLANS[i % len(board_part.PLANS)],
                                    homes[n] / notebook)
    port = free_port()
    extra = board_part.hub_config(VENV / "python", port, free_port(), work / "board-state.json")
    stop, out = multiprocessing.Event(), multiprocessing.Queue()
    with running_hub(work, extra, port) as hub:
        api = f"{hub}/services/{board_part.SERVICE}/api/board"
        wait_until(lambda: board_part.status_of(api) == 401)
        watcher = multiprocessing.Process(target=board_part.instructor,
                                          args=(hub, PASSWORD, stop, out, work / "board.png"))
        watcher.start()
        start = time.monotonic()
        times, page_status, _ = run_learners(hub, dict.fromkeys(names, notebook), homes, True)
        learners_s = time.monotonic() - start
        stop.set()
        timeline, board, instructor_status = out.get(timeout=300)
        watcher.join(timeout=60)
        env = server_tree(names[0])[0].environ()
        statuses = {"anonymous_status": board_part.status_of(api),
                    "learner_status": board_part.status_of(api, env["JUPYTERHUB_API_TOKEN"]),
                    "learner_page_status": page_status,
                    "instructor_page_status": instructor_status}
        cost = board_part.overhead(env, pairs, ROOT) if pairs else None
    shown = {k: v for n in names if n in times
             for k, v in board_part.notebook_rows(homes[n] / notebook, n).items()}
    on_board = board_part.board_rows(board)
    return {"learners": learners, "lesson": notebook, "cores": os.cpu_count(),
            "learners_s": round(learners_s, 1),
            "run_all_s": {n: round(s, 1) for n, s in times.items()},
            "rows": [{k: r[k] for k in board_part.ROW_KEYS} for r in board["rows"]],
            "checks": board["checks"], "stuck": board["stuck"], **statuses,
            "board_matches_notebooks": on_board == shown,
            "board_matches_plans": on_board == board_part.expected_rows(names),
            "timeline": timeline, "overhead": cost, "screenshot": str(work / "board.png")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lessons", nargs="+", default=["06", "08", "13", "14"],
                        help="one lesson number per learner (default: 06 08 13 14)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--board-json", type=Path,
                        help="run the workshop board rehearsal instead; write its JSON here")
    parser.add_argument("--learners", type=int, default=4, help="with --board-json (default 4)")
    parser.add_argument("--overhead-pairs", type=int, default=10,
                        help="with --board-json: checks timed with the board on and off, each "
                             "(default 10; 0 skips)")
    args = parser.parse_args()
    install()
    start = time.monotonic()
    load_before = os.getloadavg()[0]
    if args.board_json:
        result = rehearse_board(args.learners, args.overhead_pairs)
        result.update(load_before=load_before, seconds=round(time.monotonic() - start))
        board_part.print_result(result)
        print(f"{result['seconds']} s in all (load average before: {load_before:.1f})")
        args.board_json.write_text(json.dumps(result, indent=1) + "\n")
        return 0 if board_part.shows_what_it_must(result) else 1
    rows = rehearse(args.lessons)
    print(f"{len(rows)} learners at once on {os.cpu_count()} cores, "
          f"{time.monotonic() - start:.0f} s in all (load average before: {load_before:.1f})")
    print("learner    lesson                          Run All  CPU-s  PSS GiB  RSS GiB  gate")
    for r in rows:
        print(f"{r['learner']:<10} {r['lesson']:<31} {r['run_all_s']:>6.0f}s {r['cpu_s']:>6.0f} "
              f"{r['peak_pss_gib']:>7.2f}  {r['peak_rss_gib']:>7.2f}  "
              f"{'pass' if r['gate'] else 'FAIL: ' + r['verdict']}")
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "load_before": load_before,
                                         "rows": rows}, indent=1) + "\n")
    return 0 if all(r["gate"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
