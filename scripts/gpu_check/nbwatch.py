"""One job: run one notebook with nbclient so that a slow, stuck or killed run explains itself.

- The notebook is saved after every cell, so a killed run shows how far it got.
- Each code cell's start and end go to NOTEBOOK's `<stem>.events.jsonl` (cells counted from
  1, as the gate counts them); nbclient's record_timing adds the kernel's own timestamps to
  each cell's metadata.
- A watchdog dumps the stacks of this process, the kernel and every process below it (the
  ranks that course_lib starts) to `<stem>.stacks.txt` when no cell makes progress (starts,
  ends or sends a message) for STALL seconds, and again every STALL seconds while it waits.
- At CAP seconds it dumps the stacks, kills the kernel and everything below it, saves the
  notebook and exits with status 3; the events name the cell that was running.

Stacks come from py-spy (`py-spy dump --pid P`) where it is installed and may attach, else
from faulthandler: this process and its kernel register it on SIGUSR1, as course_lib's ranks
do (launching/rank_main.py), each writing to a file whose name ends in "stack".

    python scripts/gpu_check/nbwatch.py NOTEBOOK [--stall S] [--cap S] [--timeout S]
                                        [--native] [--out EXECUTED.ipynb]

scripts/gpu-check runs every notebook through it (runner.py); tests import it with scripts/
on sys.path, as tests/test_gpu_check.py does.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import psutil
from nbclient import NotebookClient
from nbclient.util import ensure_async

KILLED = 3  # exit status of a run killed at its cap
STACK_FILE = re.compile(r"stack\d*$")  # faulthandler's files: course_lib's stack0.., ours


def events_path(notebook: Path) -> Path:
    """Where a run of `notebook` logs its cells' starts and ends."""
    return notebook.with_name(notebook.stem + ".events.jsonl")


def stacks_path(notebook: Path) -> Path:
    """Where a run of `notebook` writes the stacks its watchdog dumped."""
    return notebook.with_name(notebook.stem + ".stacks.txt")


class EventLog:
    """Append-only JSON lines, shared by the client's hooks and the watchdog thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.last_progress = time.monotonic()
        self.cell: int | None = None  # the number of the code cell running now
        path.write_text("")

    def write(self, event: str, **fields: Any) -> None:
        with self.lock:
            line = json.dumps({"t": round(time.time(), 3), "event": event, **fields})
            with self.path.open("a") as f:
                f.write(line + "\n")

    def progress(self) -> None:
        self.last_progress = time.monotonic()


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of a run, oldest first ([] when it never started)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cell_spans(events: list[dict[str, Any]]) -> list[tuple[int, float, float | None]]:
    """(cell number, start, end or None if it never ended) per executed code cell, in order:
    the times to look for a wait in (a cell that took long, a gap between two cells)."""
    ends = {e["cell"]: e["t"] for e in events if e["event"] == "end"}
    return [(e["cell"], e["t"], ends.get(e["cell"])) for e in events if e["event"] == "start"]


def running_cell(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The start event of the cell that had not ended when the log stops, or None."""
    ended = {e["cell"] for e in events if e["event"] == "end"}
    started = [e for e in events if e["event"] == "start" and e["cell"] not in ended]
    return started[-1] if started else None


def describe_kill(notebook: Path, why: str) -> str:
    """'killed at <why> in cell N (running S s: `first line`); stacks: <file>' from its log."""
    events = read_events(events_path(notebook))
    cell = running_cell(events)
    killed = next((e for e in reversed(events) if e["event"] == "killed"), None)
    at = killed["t"] if killed else time.time()
    started = any(e["event"] == "start" for e in events)
    where = (f"in cell {cell['cell']} (running {at - cell['t']:.0f} s: `{cell['source']}`)"
             if cell else "between cells" if started else "before its first cell")
    stacks = stacks_path(notebook)
    return f"killed at {why} {where}" + (f"; stacks: {stacks.name}" if stacks.exists() else "")


def find_pyspy() -> str | None:
    """The py-spy program on PATH or beside this Python, or None."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and every process below it ([] once it has gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def catches_sigusr1(pid: int) -> bool:
    """Whether the process has a handler for SIGUSR1 (its default action would kill it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt"))
    return bool(int(caught, 16) >> (signal.SIGUSR1 - 1) & 1)


def faulthandler_stack(proc: psutil.Process, wait_s: float = 3.0) -> str | None:
    """Ask a process that registered faulthandler on SIGUSR1 for its Python stack, and read
    what it wrote to its stack file; None when it has no such handler or file."""
    try:
        files = [f.path for f in proc.open_files() if STACK_FILE.search(Path(f.path).name)]
    except psutil.Error:
        return None
    if not files or not catches_sigusr1(proc.pid):
        return None
    sizes = {f: os.path.getsize(f) for f in files}
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and all(os.path.getsize(f) == n for f, n in sizes.items()):
        time.sleep(0.05)
    time.sleep(0.1)  # let the last thread's lines land
    text = ""
    for f, n in sizes.items():
        with open(f, errors="replace") as stream:
            stream.seek(n)
            text += stream.read()
    return text or f"(sent SIGUSR1; nothing reached {', '.join(files)} in {wait_s:g} s)"


def stack_of(proc: psutil.Process, pyspy: str | None, native: bool = False) -> str:
    """One process's stack: py-spy's, else faulthandler's, else why there is none."""
    why = "no py-spy"
    if pyspy:
        cmd = [pyspy, "dump", "--pid", str(proc.pid)] + (["--native"] if native else [])
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                return done.stdout
            why = f"py-spy failed: {(done.stderr or done.stdout).strip()[-300:]}"
        except subprocess.TimeoutExpired:
            why = "py-spy took over 60 s"
    text = faulthandler_stack(proc)
    if text is not None:
        return f"(from faulthandler, as {why})\n{text}"
    return f"(no stack: {why}, and it has no faulthandler on SIGUSR1)\n"


def dump_stacks(root_pid: int, path: Path, why: str, pyspy: str | None = None,
                native: bool = False) -> None:
    """Append to `path` the stack of `root_pid` and of every process below it."""
    parts = [f"===== {time.strftime('%Y-%m-%d %H:%M:%S')}: {why} "
             f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})\n"]
    for proc in process_tree(root_pid):
        try:
            cpu = sum(proc.cpu_times()[:2])
            head = (f"--- pid {proc.pid} ({proc.status()}, {cpu:.1f} s of CPU): "
                    f"{' '.join(proc.cmdline())[:160]}\n")
            parts.append(head + stack_of(proc, pyspy, native))
        except (OSError, psutil.Error):
            continue  # it ended meanwhile
    with path.open("a") as f:
        f.write("\n".join(parts) + "\n")


def main_threads(text: str, frames: int = 6) -> str:
    """The last dump in a stacks file, shortened: per process its header and the innermost
    `frames` frames of its main thread (the first thread with a <module> frame)."""
    last = text[text.rfind("\n=====") + 1:] if "\n=====" in text else text
    head, *procs = last.split("\n--- ")
    out = [head.strip()]
    for proc in procs:
        header, _, body = proc.partition("\n")
        threads = re.split(r"\n(?=Thread |Current thread )", body)
        main = next((t for t in threads if "<module>" in t), None)
        lines = ([line.strip() for line in main.splitlines()[1:] if line.strip()] if main
                 else body.strip().splitlines()[-1:])  # why there is none, or a bare thread
        out.append(f"--- {header}\n" + "\n".join(f"    {line}" for line in lines[:frames]))
    return "\n".join(out)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it (course_lib's ranks sit in their own
    process groups, so a group kill would miss them)."""
    for proc in process_tree(pid):
        try:
            proc.kill()
        except psutil.Error:
            pass


class WatchedClient(NotebookClient):
    """nbclient's client that logs each code cell's start and end, saves the notebook after
    every cell, counts every kernel message as progress, and has the kernel register
    faulthandler on SIGUSR1 (the stacks' fallback where py-spy cannot attach)."""

    def __init__(self, nb: Any, out: Path, events: EventLog, kernel_stack: Path,
                 **kwargs: Any) -> None:
        super().__init__(nb, record_timing=True, on_notebook_start=self._kernel_faulthandler,
                         on_cell_execute=self._started, on_cell_executed=self._ended, **kwargs)
        self.out, self.events, self.kernel_stack = out, events, kernel_stack

    def kernel_pid(self) -> int | None:
        return getattr(getattr(self.km, "provisioner", None), "pid", None)

    async def _kernel_faulthandler(self, notebook: Any) -> None:
        self.events.write("kernel", pid=self.kernel_pid())
        code = ("__import__('faulthandler').register(__import__('signal').SIGUSR1, "
                f"file=open({str(self.kernel_stack)!r}, 'a'), all_threads=True)")
        msg_id = await ensure_async(self.kc.execute(code, silent=True, store_history=False))
        await self.async_wait_for_reply(msg_id)

    def _started(self, cell: Any, cell_index: int) -> None:
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        self.events.cell = cell_index + 1
        self.events.write("start", cell=cell_index + 1, source=first[:80])
        self.events.progress()

    def _ended(self, cell: Any, cell_index: int, execute_reply: dict | None) -> None:
        status = (execute_reply or {}).get("content", {}).get("status", "no reply")
        self.events.write("end", cell=cell_index + 1, status=status)
        self.events.cell = None
        self.events.progress()
        nbformat.write(self.nb, self.out)

    def process_message(self, msg: dict, cell: Any, cell_index: int) -> Any:
        self.events.progress()
        return super().process_message(msg, cell, cell_index)


def watchdog(client: WatchedClient, stall_s: float, cap_s: float | None, stacks: Path,
             done: threading.Event, pyspy: str | None, native: bool = False) -> None:
    """Dump the stacks after each `stall_s` without progress; at `cap_s`, dump them and kill
    the kernel (the main thread then sees it die, saves the notebook and ends)."""
    events, start = client.events, time.monotonic()
    dumps, seen = 0, events.last_progress
    while not done.wait(1.0):
        cell = events.cell
        where = f"in cell {cell}" if cell else "outside any cell (kernel start, or between cells)"
        if cap_s is not None and time.monotonic() - start >= cap_s:
            dump_stacks(os.getpid(), stacks, f"killed at the cap ({cap_s:g} s) {where}", pyspy,
                        native)
            events.write("killed", cell=events.cell, why=f"the cap ({cap_s:g} s)")
            if client.kernel_pid():
                kill_tree(client.kernel_pid())
            if not done.wait(30):  # nbclient did not notice: end anyway, notebook unsaved
                events.write("finished", status="killed", detail="nbclient missed the kill")
                os._exit(KILLED)
            return
        if events.last_progress != seen:
            dumps, seen = 0, events.last_progress
        idle = time.monotonic() - seen
        if idle >= stall_s * (dumps + 1):
            dumps += 1
            events.write("stall", cell=cell, idle=round(idle, 1))
            dump_stacks(os.getpid(), stacks, f"no progress for {idle:.0f} s {where}", pyspy,
                        native)


def run(notebook: Path, out: Path | None = None, stall_s: float = 60.0,
        cap_s: float | None = None, cell_timeout: int = 300, native: bool = False,
        pyspy: bool = True) -> int:
    """Execute `notebook` (errors allowed, as the gate judges them) into `out` (default: in
    place); pyspy=False takes the stacks from faulthandler only. Exit status: 0 every cell
    ran, 1 execution stopped early, 3 killed at the cap. Run it as a command (its own
    process): the stacks it dumps are those of its process and every process below it."""
    out = out or notebook
    nb = nbformat.read(notebook, as_version=4)
    events = EventLog(events_path(out))
    stacks_path(out).unlink(missing_ok=True)
    status, detail = "stopped", "interrupted"  # until execute() returns or raises
    with tempfile.TemporaryDirectory(prefix="nbwatch-") as tmp, \
            open(Path(tmp) / "driver-stack", "a") as own_stack:
        faulthandler.register(signal.SIGUSR1, file=own_stack, all_threads=True)
        client = WatchedClient(nb, out, events, Path(tmp) / "kernel-stack", timeout=cell_timeout,
                               allow_errors=True, kernel_name="python3",
                               resources={"metadata": {"path": str(notebook.parent)}})
        done = threading.Event()
        threading.Thread(target=watchdog, daemon=True, args=(
            client, stall_s, cap_s, stacks_path(out), done, find_pyspy() if pyspy else None,
            native)).start()
        try:
            client.execute()
            status, detail = "done", ""
        except Exception as exc:  # noqa: BLE001 - recorded in the events and the exit status
            killed = any(e["event"] == "killed" for e in read_events(events.path))
            status, detail = ("killed" if killed else "stopped"), f"{type(exc).__name__}: {exc}"
        finally:
            done.set()
            faulthandler.unregister(signal.SIGUSR1)
            nbformat.write(nb, out)
            events.write("finished", status=status, detail=detail[:500])
    return {"done": 0, "stopped": 1, "killed": KILLED}[status]


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0].removeprefix("One job: "))
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, help="write the executed notebook here "
                        "(default: in place) and its events and stacks beside it")
    parser.add_argument("--stall", type=float, default=60.0,
                        help="seconds without progress before the stacks are dumped (60)")
    parser.add_argument("--cap", type=float, help="kill the run after this many seconds")
    parser.add_argument("--timeout", type=int, default=300, help="nbclient's per-cell limit")
    parser.add_argument("--native", action="store_true", help="py-spy dump --native")
    parser.add_argument("--no-py-spy", action="store_true",
                        help="take the stacks from faulthandler only")
    args = parser.parse_args(argv)
    return run(args.notebook, args.out, args.stall, args.cap, args.timeout, args.native,
               pyspy=not args.no_py_spy)


if __name__ == "__main__":
    sys.exit(main())
