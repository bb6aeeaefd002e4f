"""Run torchrun from a notebook cell: its output streams live into the cell, each line
labelled with the job that printed it, and no process it started outlives the cell
(finished, failed, timed out or interrupted). Lesson 14."""

from __future__ import annotations

import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from course_lib import devices
from course_lib.launching.headline import headline_first
from course_lib.network import free_port, free_ports  # noqa: F401 - lesson 14 imports them here

# torchrun as this kernel's Python runs it: the course's virtual environment, whatever PATH says.
TORCHRUN = f"{shlex.quote(sys.executable)} -m torch.distributed.run"
# The course's SLURM batch script (one torchrun per node), explained in lesson 14.
SLURM_TEMPLATE = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "train.sbatch"


class TorchrunFailed(RuntimeError):
    """A job that exited with an error or ran out of time; the message quotes its errors."""


@dataclass
class Job:
    """One started command (a torchrun "node"): its process and every line it printed."""

    label: str
    command: list[str]
    process: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    lines: list[str] = field(default_factory=list)
    _partial: bytes = b""

    @property
    def seconds(self) -> float:
        """How long it ran (until now, while it still runs)."""
        return (self.ended or time.monotonic()) - self.started

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def node_gpus(node: int, nodes: int) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for "node" `node` of `nodes` simulated on this machine: GPU
    `node` when there is one per node, else none. Two nodes on one machine would otherwise
    both see GPU 0 as cuda:0 (LOCAL_RANK 0 on each) and NCCL refuses two ranks on one GPU."""
    return {"CUDA_VISIBLE_DEVICES": str(node) if devices.visible_gpus() >= nodes else ""}


def start(command: str | Sequence[str], label: str = "torchrun",
          env: dict[str, str] | None = None) -> Job:
    """Start `command` (a string is split like a shell would) in its own process group, its
    stderr merged into its stdout; `env` is added to this process's environment."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv:
        raise ValueError("start() needs a command, e.g. f'{TORCHRUN} --standalone ...'")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                               start_new_session=True)
    return Job(label, argv, process)


def wait(*jobs: Job, timeout: float = 60.0, echo: bool = True,
         stop_on_failure: bool = False) -> list[Job]:
    """Print the jobs' lines as they come until every job has ended (or, with
    `stop_on_failure`, until one exits with an error: its peers may wait for it forever);
    then (and on a timeout or an interrupt) kill whatever is left of them. Raises
    TorchrunFailed when a job exited with an error or ran past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    try:
        _stream(jobs, deadline, echo, stop_on_failure)
    finally:
        for job in jobs:
            _kill(job)
    _raise_on_failure(jobs, timeout)
    return list(jobs)


def run(command: str | Sequence[str], label: str = "torchrun",
        env: dict[str, str] | None = None, timeout: float = 60.0, echo: bool = True) -> Job:
    """start() then wait(): one job, its output streamed live."""
    return wait(start(command, label, env), timeout=timeout, echo=echo)[0]


def _stream(jobs: Sequence[Job], deadline: float, echo: bool, stop_on_failure: bool) -> None:
    with selectors.DefaultSelector() as selector:
        for job in jobs:
            selector.register(job.process.stdout, selectors.EVENT_READ, job)
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=min(0.2, max(0.0, deadline - time.monotonic()))):
                job = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    job.process.wait()
                    job.ended = time.monotonic()
                    chunk = b"\n" if job._partial else b""
                _take(job, chunk, echo, label=len(jobs) > 1)
                if stop_on_failure and job.ended and job.process.returncode:
                    return


def _take(job: Job, chunk: bytes, echo: bool, label: bool) -> None:
    """Split a chunk into whole lines; keep an unfinished last line for later."""
    *whole, job._partial = (job._partial + chunk).split(b"\n")
    for raw in whole:
        line = raw.decode(errors="replace").rstrip("\r")
        job.lines.append(line)
        if echo:
            print(f"[{job.label}] {line}" if label else line, flush=True)


def _kill(job: Job) -> None:
    """SIGKILL the job's whole process group (torchrun and its workers), then reap it."""
    try:
        os.killpg(job.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    job.process.wait()
    job.process.stdout.close()
    if job.ended is None:
        job.ended = time.monotonic()


def _raise_on_failure(jobs: Sequence[Job], timeout: float) -> None:
    problems = []
    for job in jobs:
        code = job.process.returncode
        if code == -signal.SIGKILL and job.seconds >= timeout - 0.5:
            problems.append(f"{job.label}: still running after {timeout:g} s, killed")
        elif code != 0:
            problems.append(f"{job.label}: exit code {code} after {job.seconds:.1f} s\n"
                            + "\n".join(f"    {line}" for line in error_lines(job.lines)))
    if problems:
        raise headline_first(TorchrunFailed("\n".join(problems)))  # a notebook shows it first


def error_lines(lines: Sequence[str], most: int = 4) -> list[str]:
    """The lines that name an error (torchrun's and the workers'), the last `most` of them."""
    errors = [ln.strip() for ln in lines if "Error" in ln
              and not ln.lstrip().startswith(("File ", "raise ", "^", "frame #"))]
    unique = list(dict.fromkeys(errors))
    return unique[-most:] or [ln.strip() for ln in lines[-most:]]


def _short(line: str, most: int = 115) -> str:
    """An error line without its module path, cut to `most` characters."""
    line = re.sub(r"^[\w.]+\.(\w+(Error|Exception))", r"\1", line.strip())
    return line if len(line) <= most else line[:most - 3] + "..."


def plot_jobs(jobs: Sequence[Job], title: str) -> object:
    """One bar per job, from its start to its end, green when it exited 0 and red when not,
    labelled with how it ended (the last error line it printed)."""
    from course_lib.plots.style import BLUE, GREEN, HIGHLIGHT, new_figure

    t0 = min(job.started for job in jobs)
    fig = new_figure(8.2, 1.2 + 0.9 * len(jobs))  # no wider than JupyterLab shows unshrunk
    ax = fig.subplots()
    for y, job in enumerate(jobs):
        code = job.process.returncode
        color = GREEN if code == 0 else (BLUE if code is None else HIGHLIGHT)
        ax.barh(y, job.seconds, left=job.started - t0, color=color, height=0.5)
        how = "exit 0" if code == 0 else f"exit {code}: " + _short(error_lines(job.lines, 2)[0])
        ax.text(job.started - t0 + 0.1, y + 0.36, f"{job.seconds:.1f} s, {how}", fontsize=8)
    ax.set_yticks(range(len(jobs)), [job.label for job in jobs])
    ax.set_ylim(len(jobs) - 0.3, -0.6)
    ax.set_xlabel("seconds since the first start")
    ax.set_title(title)
    return fig
