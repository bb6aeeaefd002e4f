"""A workshop, really run: a JupyterHub on this machine (local spawner, configurable-http-proxy
from npm, dummy login), N learners who log in with a browser (Playwright, Debian's
chromium) and each Run All one lesson at the same time; then each learner's CPU-seconds,
peak memory, Run All time and gate verdict. CPU-seconds include the learner's server
starting and the lesson opening.

    .venv/bin/python scripts/workshop_rehearsal.py --lessons 06 08 13 14 [--json OUT]

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
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # browser_lab: the browser check's page actions
from browser_lab import free_port  # noqa: E402 - importable once tests/ is on the path

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
        subprocess.run(["npm", "install", "--silent", "--prefix", ROOT / ".hub",
                        "configurable-http-proxy"], check=True)


def hub_config(work: Path, port: int) -> Path:
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
""")
    return config


def wait_for(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def learner_home(work: Path, name: str) -> Path:
    """The learner's own copy of the course."""
    home = work / "home" / name
    for folder in ("notebooks", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, home / folder)
    return home


def learner(hub: str, name: str, lesson: str, home: Path, results: multiprocessing.Queue) -> None:
    """One learner: log in, open the lesson, Run All, save. Runs in a process of its own."""
    import nbformat
    from browser_lab import CHROMIUM, CHROMIUM_ARGS, open_notebook, run_all, saved_notebook
    from playwright.sync_api import sync_playwright

    path = home / "notebooks" / lesson
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
        open_notebook(page, f"{hub}/user/{name}/lab/tree/notebooks/{lesson}", cells,
                      timeout_ms=300_000)
        run_all(page, RUN_ALL_TIMEOUT_MS)
        seconds = time.monotonic() - start
        saved_notebook(page, path)
        page.screenshot(path=str(home / "page.png"))
        browser.close()
    results.put((name, seconds))


def server_tree(name: str) -> list[psutil.Process]:
    """The learner's single-user server and everything under it."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any("jupyterhub-singleuser" in part for part in proc.info["cmdline"] or []) \
                    and proc.environ().get("JUPYTERHUB_USER") == name:
                return [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return []


class Meter:
    """Samples each learner's processes. CPU-seconds: a process still there at the last
    sample counts its own time and its reaped children's; one that was reaped by a process
    of the tree is counted in its parent's children time, the rest by its last reading.
    Memory: the peak of the proportional set sizes (PSS: a page shared by k processes
    counts 1/k in each) summed over the tree, and of the resident sets (RSS, shared pages
    counted in every process: an upper bound)."""

    def __init__(self, names: list[str]):
        self.seen: dict[str, dict[int, tuple[int, float, float]]] = {n: {} for n in names}
        self.alive: dict[str, set[int]] = {n: set() for n in names}
        self.peak = dict.fromkeys(names, 0)
        self.peak_rss = dict.fromkeys(names, 0)

    def sample(self) -> None:
        for name, seen in self.seen.items():
            pss, rss, alive = 0, 0, set()
            for proc in server_tree(name):
                try:
                    t = proc.cpu_times()
                    seen[proc.pid] = (proc.ppid(), t.user + t.system,
                                      t.children_user + t.children_system)
                    memory = proc.memory_full_info()
                    pss, rss = pss + memory.pss, rss + memory.rss
                    alive.add(proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.alive[name] = alive
            self.peak[name] = max(self.peak[name], pss)
            self.peak_rss[name] = max(self.peak_rss[name], rss)

    def cpu_seconds(self, name: str) -> float:
        seen, alive = self.seen[name], self.alive[name]
        return sum(own + children for pid, (ppid, own, children) in seen.items()
                   if pid in alive or ppid not in seen)


def gate(home: Path, lesson: str) -> tuple[bool, str]:
    out = subprocess.run([VENV / "python", "-m", "course_lib", "gate", "--executed",
                          home / "notebooks" / lesson], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    return out.returncode == 0, out.stdout.strip().splitlines()[-1] if out.stdout else out.stderr


def rehearse(lessons: list[str]) -> list[dict]:
    names = [f"learner{i + 1}" for i in range(len(lessons))]
    files = {n: next(p.name for p in (ROOT / "notebooks").glob(f"{lesson}_*.ipynb"))
             for n, lesson in zip(names, lessons)}
    work = Path(tempfile.mkdtemp(prefix="course-hub-"))
    homes = {n: learner_home(work, n) for n in names}
    port = free_port()
    with open(work / "hub.log", "w") as log:
        hub = subprocess.Popen([VENV / "jupyterhub", "-f", hub_config(work, port)], cwd=work,
                               stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(f"http://127.0.0.1:{port}/hub/api")
            times, meter = run_learners(f"http://127.0.0.1:{port}", files, homes)
        finally:
            hub.terminate()
            hub.wait(timeout=60)
            print(f"hub log and learners' homes (screenshots): {work}")
    rows = []
    for n in names:
        passed, verdict = gate(homes[n], files[n]) if n in times else (False, "no run")
        rows.append({"learner": n, "lesson": files[n], "run_all_s": round(times.get(n, 0), 1),
                     "cpu_s": round(meter.cpu_seconds(n), 1),
                     "peak_pss_gib": round(meter.peak[n] / 2**30, 2),
                     "peak_rss_gib": round(meter.peak_rss[n] / 2**30, 2), "gate": passed,
                     "verdict": verdict})
    return rows


def run_learners(hub: str, files: dict[str, str], homes: dict[str, Path]
                 ) -> tuple[dict[str, float], Meter]:
    """Every learner at once, each in a process of its own, metered until all are done."""
    results: multiprocessing.Queue = multiprocessing.Queue()
    meter = Meter(list(files))
    procs = [multiprocessing.Process(target=learner, args=(hub, n, files[n], homes[n], results))
             for n in files]
    for proc in procs:
        proc.start()
    while any(proc.is_alive() for proc in procs):
        meter.sample()
        time.sleep(0.5)
    return dict(results.get_nowait() for _ in range(results.qsize())), meter


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lessons", nargs="+", default=["06", "08", "13", "14"],
                        help="one lesson number per learner (default: 06 08 13 14)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    install()
    start = time.monotonic()
    load_before = os.getloadavg()[0]
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
