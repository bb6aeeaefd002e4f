"""`check_main` for lesson 14: it runs the learner's main() under torchrun as one node of 3
workers (`--standalone`) and as two nodes of 1 worker (two torchrun agents on this machine, a
c10d rendezvous on loopback, where LOCAL_RANK differs from RANK), and compares the final
weights with the notebook launch of the same train() and with the one-process result. It also
checks that main() leaves the process group on every path: after train() returns, and when
train() raises (one more run, 1 process, with torchrun's environment). GPUs are hidden from
the check's processes (CUDA_VISIBLE_DEVICES=""), so it judges the same thing on every machine;
in the one-node run torch.cuda reports 1 GPU for the 3 workers (entry's stand-in), where
main() must choose gloo.
Each worker runs `entry`, whose MARK lines say what main() did; the hints are built from them.
"""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from course_lib import devices
from course_lib.checks.common import (
    CHECK_TIMEOUT,
    NotWritten,
    Rejected,
    check,
    differing,
    is_stub,
    on_ranks,
)
from course_lib.checks.lesson14.entry import GPUS, MARK
from course_lib.checks.lesson14.training import RAISE, one_process, train
from course_lib.launching.payload import dumps
from course_lib.teach.torchrun import (
    TORCHRUN,
    TorchrunFailed,
    error_lines,
    free_port,
    start,
    wait,
)

ENTRY = "course_lib.checks.lesson14.entry"  # the module each torchrun worker runs
# (how torchrun is started, its world size): one node of 3 workers, two nodes of 1 worker.
RUNS = (("one node", 3), ("two nodes", 2))
STAND_IN_GPUS = {"one node": "1"}  # what torch.cuda.device_count() says in a run's workers
# Seconds one torchrun of the check may take. The solution's took 5-15 s each on 2 cores
# under load 5-7 (torchrun and every worker import torch); 120 s leaves 8x.
TORCHRUN_TIMEOUT = 120.0
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""}
NCCL_HINT = f"NCCL needs a GPU for each process, and this check's nodes have none: {devices.RULE}"

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


def _notebook_train(fn: Callable, out_dir: str) -> dict[str, torch.Tensor]:
    """On a rank of the notebook launcher: fn(out_dir) (fn is train)."""
    return fn(out_dir)


@check
def check_main(fn: Callable, timeout: float = CHECK_TIMEOUT,
               torchrun_timeout: float = TORCHRUN_TIMEOUT) -> str:
    """Run `fn` as a script's main() under torchrun, as one node of 3 workers and as two nodes
    of 1; pass when its final weights equal the notebook launch's and the one-process
    result, and when it leaves the process group after train() returned and after it raised."""

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


def _commands(pickled: Path, out: Path, how: str, n: int) -> list[tuple[str, str]]:
    """(label, command) of each torchrun agent: one --standalone node, or two nodes that meet
    at a c10d endpoint on this machine (node 1 a client, as a second machine would be)."""
    entry = f"-m {ENTRY} {pickled} {out}"
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
    env = {**ENV, GPUS: STAND_IN_GPUS[how]} if how in STAND_IN_GPUS else ENV
    jobs = [start(command, label, env) for label, command in _commands(pickled, out, how, n)]
    try:
        wait(*jobs, timeout=limit, echo=False, stop_on_failure=True)
    except TorchrunFailed as failed:
        text = "\n".join(job.output for job in jobs) + "\n" + str(failed)
        if is_stub(text):
            raise NotWritten(fn) from None
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
    job = start([sys.executable, "-m", ENTRY, str(pickled), str(out)],
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
    if kind == "nccl-without-gpu":
        seen = dict(re.findall(r"([\w]+)=(\S+)", rest))
        asked = (f"asked for cuda:{seen['set_device']}, which does not exist"
                 if "set_device" in seen else "chose the NCCL backend")
        return (f"where torch.cuda.device_count() is {seen['gpus']} for the node's "
                f"{seen['LOCAL_WORLD_SIZE']} processes (the check's stand-in for a 1-GPU "
                f"machine), your {name}() {asked}: on a real one, ranks 1 and up fail with "
                "'CUDA error: invalid device ordinal'. torch.cuda.is_available() only says that "
                "there is a GPU; choose 'nccl' only when int(os.environ['LOCAL_WORLD_SIZE']) "
                "<= torch.cuda.device_count(), else 'gloo'")
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
