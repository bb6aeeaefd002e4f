"""Run one `pip install` for scripts/setup and show that it moves, without pip's noise.

A line for each download of 1 MB or more, with its size; then, while pip works, either one
live line with pip's own byte count (on a terminal) or, in a log (CI, a pipe, a file), a line
at least every --every seconds: "still downloading torch-...: 61 of 200 MB (40 s so far)".
Pip's exit status is this script's; everything pip printed is kept in --log.

    python scripts/pip_progress.py [--every 20] [--log FILE] -- PYTHON -m pip install ARGS...

Pass pip `--progress-bar raw` for byte counts (pip 24.1 and later print "Progress N of M").
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from urllib.parse import unquote

# What pip prints that a learner does not need: its resolver's and builder's steps, this
# machine's pip configuration ("Location ... is ignored"), retries, version notices.
NOISE = re.compile(
    r"is ignored|^WARNING: Retrying|^\[notice\]|^Looking in (indexes|links)|^Collecting |"
    r"^Processing |^Obtaining |^Requirement already satisfied|^(Installing build dependencies|"
    r"Checking if build backend|Getting requirements to build|Preparing (editable )?metadata|"
    r"Building (editable|wheel)|Building wheels for|Created wheel|Stored in directory|"
    r"Successfully built|Attempting uninstall|Found existing installation|Uninstalling |"
    r"Successfully uninstalled)|^\s*$")
# setuptools' "Editable installation" note (information only, about this flat layout): from
# its first line to the source line its warning points at, at most 10 lines.
NOTE_START, NOTE_END, NOTE_LINES = "BuildBackendWarning: Editable installation", "WheelFile(", 10
FILE = re.compile(r"^(Downloading|Using cached) (\S+)(?: \(([\d.]+) (kB|MB|GB)\))?")
PROGRESS = re.compile(r"^Progress (\d+) of (\d+)")
UNITS = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
BIG = 1e6  # downloads from this size up get a line of their own


def duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def megabytes(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n < 10e6 else f"{n / 1e6:.0f} MB"


class Progress:
    """What pip is doing now, from its lines; and what this step has fetched so far."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.doing = "starting pip"
        self.file, self.done, self.total = "", 0, 0
        self.fetched, self.files, self.installed = 0.0, 0, 0
        self.note_left = 0

    def read(self, line: str) -> str | None:
        """Take one line of pip's; return what to print for it, or None."""
        text = line.strip()
        if self.note_left or NOTE_START in text:
            self.note_left = 0 if NOTE_END in text else (self.note_left or NOTE_LINES) - 1
            return None
        if m := PROGRESS.match(text):
            self.done, self.total = int(m[1]), int(m[2])
            return None
        if m := FILE.match(text):
            return self._file(m[1], unquote(m[2]).rsplit("/", 1)[-1],
                              float(m[3] or 0) * UNITS.get(m[4], 0))
        if text.startswith(("Collecting ", "Processing ", "Obtaining ")):
            what = unquote(text.split()[1]).rsplit("/", 1)[-1]
            self.file, self.doing = "", f"resolving what to install ({what})"
        elif text.startswith("Installing build dependencies"):
            self.file, self.doing = "", "building the course's package"
        elif text.startswith("Installing collected packages:"):
            names = text.split(":", 1)[1].split(",")
            self.file, self.doing = "", f"installing {len(names)} package(s)"
        elif text.startswith("Successfully installed "):
            self.installed = len(text.split()) - 2
        if NOISE.search(text) or text.startswith(("Installing collected", "Successfully inst")):
            return None
        return line.rstrip()

    def _file(self, how: str, name: str, size: float) -> str | None:
        if how == "Using cached":
            return f"  from pip's cache: {name} ({megabytes(size)})" if size >= BIG else None
        self.fetched, self.files = self.fetched + size, self.files + 1
        self.file, self.done, self.total = name, 0, 0  # pip counts bytes from 512 kB up
        return f"  downloading {name} ({megabytes(size)})" if size >= BIG else None

    def now(self) -> str:
        """A one-line state: the download's bytes, or what pip is doing, and the time so far."""
        so_far = duration(time.monotonic() - self.start)
        if self.file and self.done < self.total:
            return (f"still downloading {self.file}: {megabytes(self.done)} of "
                    f"{megabytes(self.total)} ({so_far} so far)")
        return f"still working: {self.doing} ({so_far} so far)"

    def summary(self) -> str:
        got = (f"downloaded {self.files} file(s), {megabytes(self.fetched)}" if self.files
               else "nothing downloaded")
        put = f"installed {self.installed} package(s)" if self.installed else "nothing new"
        return f"  done in {duration(time.monotonic() - self.start)}: {got}; {put}"


class Screen:
    """Where the lines go: on a terminal one live status line rewritten in place; elsewhere
    a plain line whenever nothing was printed for `every` seconds."""

    def __init__(self, every: float, out=sys.stdout) -> None:
        self.every, self.out, self.live = every, out, out.isatty()
        self.last = time.monotonic()

    def line(self, text: str) -> None:
        self.out.write(("\r\x1b[K" if self.live else "") + text + "\n")
        self.out.flush()
        self.last = time.monotonic()

    def tick(self, state: Progress) -> None:
        if self.live:
            width = shutil.get_terminal_size().columns - 1
            self.out.write("\r\x1b[K" + ("  " + state.now())[:width])
            self.out.flush()
        elif time.monotonic() - self.last >= self.every:
            self.line("  " + state.now())

    def clear(self) -> None:
        if self.live:
            self.out.write("\r\x1b[K")
            self.out.flush()


def _forward(stream, lines: queue.Queue) -> None:
    """Every line of the stream into the queue, then None at its end."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def run(command: list[str], every: float, log_path: str | None, out=sys.stdout) -> int:
    """Run pip, print its progress, return its exit status."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_forward, args=(pip.stdout, lines), daemon=True).start()
    state, screen = Progress(), Screen(every, out)
    with open(log_path or os.devnull, "a") as log:
        try:
            _show(lines, state, screen, log)
            status = pip.wait()
        except KeyboardInterrupt:
            status = pip.wait() or 130
        finally:
            screen.clear()
    if status == 0:
        screen.line(state.summary())
    else:
        where = f"; all it printed is in {log_path}" if log_path else ""
        screen.line(f"pip exited with status {status}{where}")
    return status


def _show(lines: queue.Queue, state: Progress, screen: Screen, log) -> None:
    """Until pip's output ends: each line to the log, what matters of it to the screen, and
    the progress line whenever it is due."""
    while True:
        try:
            line = lines.get(timeout=min(0.25, screen.every / 4))
        except queue.Empty:
            screen.tick(state)
            continue
        if line is None:
            return
        log.write(line)
        shown = state.read(line)
        if shown is not None:
            screen.line(shown)
        screen.tick(state)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=20.0,
                        help="in a log, print a line at least this often (seconds)")
    parser.add_argument("--log", help="append everything pip printed to this file")
    parser.add_argument("command", nargs="+", help="the pip command, after --")
    args = parser.parse_args(argv)
    return run(args.command, args.every, args.log)


if __name__ == "__main__":
    sys.exit(main())
