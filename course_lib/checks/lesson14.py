"""Checks for lesson 14's exercise: write the main() that makes a notebook training function
torchrun-ready. The check runs the learner's main() under torchrun as one node of 3 workers
(`--standalone`) and as two nodes of 1 worker (two torchrun agents on this machine, a c10d
rendezvous on loopback, where LOCAL_RANK differs from RANK), and compares the final weights
with the notebook launch of the same train() and with the one-process result. It also checks
that main() leaves the process group on every path: after train() returns, and when train()
raises (one more run, 1 process, with torchrun's environment). GPUs are hidden from the
check's processes (CUDA_VISIBLE_DEVICES=""), so it judges the same thing on every machine.

`python -m course_lib.checks.lesson14 FUNCTION.pkl OUT_DIR` is the script torchrun starts:
it loads the learner's main() (cloudpickled by the check) and calls it with
sys.argv = [script, OUT_DIR], as `torchrun ... train.py OUT_DIR` would. It watches what
main() passes to init_process_group and whether the group is still there when main() ends,
and says so in a line that starts with MARK.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Rejected,
    differing,
    on_ranks,
    run_check,
)
from course_lib.checks.result import CheckResult
from course_lib.launching.payload import dumps
from course_lib.teach.torchrun import (
    TORCHRUN,
    TorchrunFailed,
    error_lines,
    free_port,
    start,
    wait,
)

# (how torchrun is started, its world size): one node of 3 workers, two nodes of 1 worker.
RUNS = (("one node", 3), ("two nodes", 2))
WORLD_SIZES = tuple(n for _, n in RUNS)
BATCH = 12  # the global batch of a step, split evenly over 2 or 3 ranks
STEPS = 4
# Seconds one torchrun of the check may take. The solution's took 5-15 s each on 2 cores
# under load 5-7 (torchrun and every worker import torch); 120 s leaves 8x.
TORCHRUN_TIMEOUT = 120.0
MARK = "CHECK14:"  # the entry's own lines, read back by the check
RAISE = "COURSE_CHECK14_RAISE"  # set: train() raises InjectedFailure once the group exists
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""}
NCCL_HINT = ("the NCCL backend needs a GPU for each process of the node, and this check's "
             "nodes have none: choose 'nccl' only when int(os.environ['LOCAL_WORLD_SIZE']) "
             "<= torch.cuda.device_count(), else 'gloo'")

# PyTorch's error texts in the workers' output, with what they mean for a main().
KNOWN = [
    ("Default process group has not been initialized",
     "train() found no process group: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and "
     "MASTER_PORT, but joining the group is the script's job: call "
     "dist.init_process_group(...) before train()"),
    ("ProcessGroupNCCL is only supported with GPUs", NCCL_HINT),
    ("Distributed package doesn't have NCCL built in", NCCL_HINT),
    ("No backend type associated with device type cpu", NCCL_HINT),
    ("rank < size",  # gloo's own check: a rank number >= the world size it was given
     "a rank is out of range for the world size you gave init_process_group: take both "
     "from the environment, int(os.environ['RANK']) and int(os.environ['WORLD_SIZE'])"),
    ("Connection closed by peer",
     "a rank left while another waited for it in a collective: every rank must call "
     "train(), not only rank 0 (DDP's constructor and every backward are collectives)"),
]


class InjectedFailure(RuntimeError):
    """The error the check makes train() raise, to see whether main() still leaves the group."""


# -- the training function the exercise makes torchrun-ready ----------------------------------

def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (every rank, and the one-process reference, builds it)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(out_dir: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """DDP training on this rank's share of each batch; rank 0 saves out_dir/final.pt.
    With COURSE_CHECK14_RAISE set, it raises InjectedFailure instead (the group exists)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if os.environ.get(RAISE):
        raise InjectedFailure("train() failed (the check made it raise)")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        loss = F.mse_loss(model(x[rank::world_size]), y[rank::world_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    if rank == 0:
        torch.save(weights, os.path.join(out_dir, "final.pt"))
    return weights


def one_process(steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The true result: the same training in one process on the whole batch of each step
    (DDP's average of equal shards' mean losses is the whole batch's mean loss)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step)
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _notebook_train(fn: Callable, out_dir: str) -> dict[str, torch.Tensor]:
    """On a rank of the notebook launcher: fn(out_dir) (fn is train)."""
    return fn(out_dir)


# -- check_main(main): the learner's entry point under torchrun -------------------------------

def check_main(fn: Callable, timeout: float = CHECK_TIMEOUT,
               torchrun_timeout: float = TORCHRUN_TIMEOUT) -> CheckResult:
    """Run `fn` as a script's main() under torchrun, as one node of 3 workers and as two nodes
    of 1; pass when its final weights equal the notebook launch's and the one-process
    result, and when it leaves the process group after train() returned and after it raised."""

    def judge() -> str:
        want = one_process()
        gaps = []
        with tempfile.TemporaryDirectory(prefix="check14-") as work:
            pickled = Path(work) / "main.pkl"
            pickled.write_bytes(dumps(fn))
            for how, n in RUNS:
                notebook = Path(work) / f"notebook-{n}"
                notebook.mkdir()
                launched = on_ranks(_notebook_train, train, n, (str(notebook),), timeout)[0]
                got = _under_torchrun(fn, pickled, Path(work) / f"torchrun-{n}", how, n,
                                      torchrun_timeout)
                _compare(got, launched, want, how, n)
                gaps.append(max((got[k] - launched[k]).abs().max().item() for k in got))
            _when_train_raises(fn, pickled, Path(work) / "raises", torchrun_timeout)
        return (f"under torchrun as one node of 3 workers and as two nodes of 1, your script's "
                f"final weights equal the notebook launch's (largest difference "
                f"{max(gaps):.1e}) and the one-process result, and it leaves the process "
                "group after train() returned and after train() raised")

    return run_check("check_main", fn, judge)


def _commands(pickled: Path, out: Path, how: str, n: int) -> list[tuple[str, str]]:
    """(label, command) of each torchrun agent: one --standalone node, or two nodes that meet
    at a c10d endpoint on this machine (node 1 a client, as a second machine would be)."""
    entry = f"-m course_lib.checks.lesson14 {pickled} {out}"
    if how == "one node":
        return [("torchrun", f"{TORCHRUN} --standalone --nproc-per-node {n} {entry}")]
    node = (f"{TORCHRUN} --nnodes {n} --nproc-per-node 1 --rdzv-backend c10d --rdzv-id check14 "
            f"--rdzv-endpoint 127.0.0.1:{free_port()} --rdzv-conf join_timeout=60,read_timeout=30")
    return [(f"node {i}", f"{node}{',is_host=false' if i else ''} {entry}") for i in range(n)]


def _under_torchrun(fn: Callable, pickled: Path, out: Path, how: str, n: int,
                    limit: float) -> dict[str, torch.Tensor]:
    """torchrun as `how` at n ranks with the learner's main(); rank 0's final weights."""
    out.mkdir()
    name = getattr(fn, "__name__", "main")
    where = f"under torchrun as {how} ({n} ranks)"
    jobs = [start(command, label, ENV) for label, command in _commands(pickled, out, how, n)]
    try:
        wait(*jobs, timeout=limit, echo=False, stop_on_failure=True)
    except TorchrunFailed as failed:
        text = "\n".join(job.output for job in jobs) + "\n" + str(failed)
        if "NotImplementedError" in text:
            raise NotImplementedError(
                f"{name}() is not written yet: replace its TODO with your code, run that "
                "cell, then run this check again.") from None
        raise Rejected(_hint(text, name, where)) from None
    final = out / "final.pt"
    if not final.exists():
        raise Rejected(f"{where} your {name}() ended without error, but train() wrote no "
                       f"final.pt into the folder given on the command line ({out.name}): "
                       "pass sys.argv[1] to train() on every rank")
    return torch.load(final, weights_only=True)


def _when_train_raises(fn: Callable, pickled: Path, out: Path, limit: float) -> None:
    """One process with torchrun's environment, train() made to raise: main() must let the
    error through and leave the group on its way out."""
    out.mkdir()
    name = getattr(fn, "__name__", "main")
    env = {**ENV, RAISE: "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_RESTART_COUNT": "0"}
    job = start([sys.executable, "-m", "course_lib.checks.lesson14", str(pickled), str(out)],
                "when train() raises", env)
    try:
        wait(job, timeout=limit, echo=False)
    except TorchrunFailed as failed:
        text = job.output + "\n" + str(failed)
        raise Rejected(_hint(text, name, "when train() raised,")) from None
    if f"{MARK} swallowed" in job.output:
        raise Rejected(f"when train() raised, your {name}() returned normally: let the error "
                       "through (no except that swallows it), or torchrun never learns that "
                       "the worker failed and cannot restart it")


def _hint(text: str, name: str, where: str) -> str:
    """The hint for a failed run: what the entry saw main() do, a known PyTorch error, else
    the run's error lines."""
    # torchrun can join two workers' lines into one: take every piece after a MARK.
    marks = [piece.strip() for ln in text.splitlines() for piece in ln.split(MARK)[1:]]
    for mark in marks:
        hint = _hint_of_mark(mark, name)
        if hint:
            return f"{where} {hint}"
    for fragment, hint in KNOWN:
        if fragment in text:
            return f"{where} your {name}() failed: {hint}\n  {_errors(text)}"
    if "still running after" in text:
        return (f"{where} your {name}() did not finish: a rank probably waits for others "
                "that never join (every rank must call init_process_group and train() "
                "once)\n  " + _errors(text))
    return f"{where} your {name}() failed:\n  {_errors(text)}"


def _hint_of_mark(mark: str, name: str) -> str | None:
    """What the entry's line says main() did, as a hint; None for a line of another kind."""
    kind, _, rest = mark.partition(" ")
    if kind == "left-group-initialized":
        return (f"your {name}() {rest} with the process group still initialized: call "
                "dist.destroy_process_group() at its end, in a finally: block so that it "
                "also runs when train() raises")
    if kind != "init":
        return None
    seen = {"rank": "-1", "world_size": "-1"} | dict(re.findall(r"(\w+)=(-?\d+)", rest))
    wrong = []
    for arg, env, local in (("rank", "RANK", "LOCAL_RANK"),
                            ("world_size", "WORLD_SIZE", "LOCAL_WORLD_SIZE")):
        if seen[arg] not in ("-1", seen.get(env)):
            source = (f"that is {local}, counted on this node only"
                      if seen[arg] == seen.get(local)
                      else "a number typed in, not read from the environment")
            wrong.append(f"{arg}={seen[arg]} where torchrun set {env}={seen.get(env)} ({source})")
    return (f"your {name}() passed init_process_group {'; '.join(wrong)}: take "
            "int(os.environ['RANK']) and int(os.environ['WORLD_SIZE']), which count every "
            "process of every node")


def _errors(text: str) -> str:
    """The workers' error lines (torchrun's own ChildFailedError says nothing more)."""
    lines = [ln for ln in text.splitlines() if "ChildFailedError" not in ln]
    return "\n  ".join(error_lines(lines, 3))


def _compare(got: dict[str, torch.Tensor], launched: dict[str, torch.Tensor],
             want: dict[str, torch.Tensor], how: str, n: int) -> None:
    wrong = differing(got, launched)
    if wrong:
        raise Rejected(f"under torchrun as {how} ({n} ranks), the final {', '.join(wrong)} "
                       "differ from the notebook launch of the same train(): each rank must "
                       "train with its own RANK and the real WORLD_SIZE, both read from the "
                       "environment")
    wrong = differing(launched, want)
    if wrong:  # the launcher itself disagrees with one process: the check's own fault
        raise AssertionError(f"the notebook launch at {n} ranks differs from one process in "
                             f"{wrong}: lesson 14's check is broken")


def _entry(argv: list[str]) -> None:
    """torchrun's worker: call the pickled main() as `script OUT_DIR` would run it, watching
    what it passes to init_process_group and whether it leaves the group on every path."""
    if len(argv) != 2:
        sys.exit("usage: python -m course_lib.checks.lesson14 FUNCTION.pkl OUT_DIR")
    _watch_init()  # before loading: a main() that imported init_process_group gets this one
    main = cloudpickle.loads(Path(argv[0]).read_bytes())
    sys.argv = ["train.py", argv[1]]
    # Run as __main__, this module is not the one main() imports train() from.
    injected = importlib.import_module("course_lib.checks.lesson14").InjectedFailure
    try:
        main()
    except injected:
        _leave(0, "returned" if dist.is_initialized() else None)  # the error we asked for
    if os.environ.get(RAISE):
        _say("swallowed InjectedFailure")
    _leave(0, "returned" if dist.is_initialized() else None)


def _watch_init() -> None:
    """Replace init_process_group by one that first compares the rank and world size it is
    given with torchrun's; a mismatch ends the process at once (its peers would wait for
    ranks that never come) with a line that says what was given."""
    original = dist.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind_partial(*args, **kwargs).arguments
        rank, size = given.get("rank", -1), given.get("world_size", -1)
        env = {k: os.environ.get(k, "?") for k in
               ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        if str(rank) not in ("-1", env["RANK"]) or str(size) not in ("-1", env["WORLD_SIZE"]):
            _say(f"init rank={rank} world_size={size} "
                 + " ".join(f"{k}={v}" for k, v in env.items()))
            _leave(3, None)
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def _say(line: str) -> None:
    print(f"{MARK} {line}", flush=True)


def _leave(code: int, left_group: str | None) -> None:
    """Leave without running C++ destructors: PyTorch 2.13's gloo can abort there
    ("terminate called without an active exception", docs/facts.md), and that is not the
    learner's code; the course's own ranks end the same way. `left_group` names how main()
    ended with the group still initialized (exit code 4)."""
    if left_group:
        _say(f"left-group-initialized {left_group}")
        code = 4
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _entry(sys.argv[1:])
