"""Checks for lesson 14's exercise: write the main() that makes a notebook training function
torchrun-ready. The check runs the learner's main() under `torchrun --standalone` at 2 and 3
ranks and compares the final weights with the notebook launch of the same train() and with
the one-process result.

`python -m course_lib.checks.lesson14 FUNCTION.pkl OUT_DIR` is the script torchrun starts:
it loads the learner's main() (cloudpickled by the check) and calls it with
sys.argv = [script, OUT_DIR], as `torchrun ... train.py OUT_DIR` would.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

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
    listing,
    on_ranks,
    run_check,
)
from course_lib.checks.result import CheckResult
from course_lib.launching.payload import dumps
from course_lib.teach.torchrun import TORCHRUN, TorchrunFailed, error_lines, run

WORLD_SIZES = (2, 3)
BATCH = 12  # the global batch of a step, split evenly over 2 or 3 ranks
STEPS = 4
# Seconds one torchrun of the check may take. The solution's took 5-15 s each on 2 cores
# under load 5-7 (torchrun and every worker import torch); 120 s leaves 8x.
TORCHRUN_TIMEOUT = 120.0

# PyTorch's error texts in the workers' output, with what they mean for a main().
KNOWN = [
    ("Default process group has not been initialized",
     "train() found no process group: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and "
     "MASTER_PORT, but joining the group is the script's job: call "
     "dist.init_process_group(...) before train()"),
    ("ProcessGroupNCCL is only supported with GPUs",
     "the NCCL backend needs GPUs and this machine has none: choose the backend with "
     "'nccl' if torch.cuda.is_available() else 'gloo'"),
    ("Distributed package doesn't have NCCL built in",
     "the NCCL backend needs GPUs and this PyTorch (a CPU build) has no NCCL: choose the "
     "backend with 'nccl' if torch.cuda.is_available() else 'gloo'"),
    ("rank < size",  # gloo's own check: a rank number >= the world size it was given
     "a rank is out of range for the world size you gave init_process_group: take both "
     "from the environment, int(os.environ['RANK']) and int(os.environ['WORLD_SIZE'])"),
    ("Connection closed by peer",
     "a rank left while another waited for it in a collective: every rank must call "
     "train(), not only rank 0 (DDP's constructor and every backward are collectives)"),
]


# -- the training function the exercise makes torchrun-ready ----------------------------------

def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (every rank, and the one-process reference, builds it)."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def train(out_dir: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """DDP training on this rank's share of each batch; rank 0 saves out_dir/final.pt."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
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
    """Run `fn` as a script's main() under torchrun --standalone at 2 and 3 ranks; pass when
    its final weights equal the notebook launch's and the one-process result."""

    def judge() -> str:
        want = one_process()
        gaps = []
        with tempfile.TemporaryDirectory(prefix="check14-") as work:
            pickled = Path(work) / "main.pkl"
            pickled.write_bytes(dumps(fn))
            for n in WORLD_SIZES:
                notebook = Path(work) / f"notebook-{n}"
                notebook.mkdir()
                launched = on_ranks(_notebook_train, train, n, (str(notebook),), timeout)[0]
                got = _under_torchrun(fn, pickled, Path(work) / f"torchrun-{n}", n,
                                      torchrun_timeout)
                _compare(got, launched, want, n)
                gaps.append(max((got[k] - launched[k]).abs().max().item() for k in got))
        return (f"under torchrun --standalone at {listing(WORLD_SIZES)} ranks, your script's "
                f"final weights equal the notebook launch's (largest difference "
                f"{max(gaps):.1e}) and the one-process result")

    return run_check("check_main", fn, judge)


def _under_torchrun(fn: Callable, pickled: Path, out: Path, n: int,
                    limit: float) -> dict[str, torch.Tensor]:
    """torchrun --standalone at n ranks with the learner's main(); rank 0's final weights."""
    out.mkdir()
    name = getattr(fn, "__name__", "main")
    command = (f"{TORCHRUN} --standalone --nproc-per-node {n} -m course_lib.checks.lesson14 "
               f"{pickled} {out}")
    try:
        run(command, label=f"torchrun {n} ranks", timeout=limit, echo=False,
            env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    except TorchrunFailed as failed:
        text = str(failed)
        if "NotImplementedError" in text:
            raise NotImplementedError(
                f"{name}() is not written yet: replace its TODO with your code, run that "
                "cell, then run this check again.") from None
        raise Rejected(_hint(text, name, n)) from None
    final = out / "final.pt"
    if not final.exists():
        raise Rejected(f"under torchrun at {n} ranks your {name}() ended without error, but "
                       f"train() wrote no final.pt into the folder given on the command line "
                       f"({out.name}): pass sys.argv[1] to train() on every rank")
    return torch.load(final, weights_only=True)


def _hint(text: str, name: str, n: int) -> str:
    """The hint for a failed torchrun: a known PyTorch error, else its error lines."""
    for fragment, hint in KNOWN:
        if fragment in text:
            return f"under torchrun at {n} ranks your {name}() failed: {hint}\n  {_errors(text)}"
    if "still running after" in text:
        return (f"under torchrun at {n} ranks your {name}() did not finish: a rank probably "
                "waits for others that never join (every rank must call "
                "init_process_group and train() once)\n  " + _errors(text))
    return f"under torchrun at {n} ranks your {name}() failed:\n  {_errors(text)}"


def _errors(text: str) -> str:
    """The workers' error lines (torchrun's own ChildFailedError says nothing more)."""
    lines = [ln for ln in text.splitlines() if "ChildFailedError" not in ln]
    return "\n  ".join(error_lines(lines, 3))


def _compare(got: dict[str, torch.Tensor], launched: dict[str, torch.Tensor],
             want: dict[str, torch.Tensor], n: int) -> None:
    wrong = differing(got, launched)
    if wrong:
        raise Rejected(f"under torchrun at {n} ranks, the final {', '.join(wrong)} differ from "
                       "the notebook launch of the same train(): each rank must train with "
                       "its own RANK and the real WORLD_SIZE, both read from the environment")
    wrong = differing(launched, want)
    if wrong:  # the launcher itself disagrees with one process: the check's own fault
        raise AssertionError(f"the notebook launch at {n} ranks differs from one process in "
                             f"{wrong}: lesson 14's check is broken")


def _entry(argv: list[str]) -> None:
    """torchrun's worker: call the pickled main() as `script OUT_DIR` would run it."""
    if len(argv) != 2:
        sys.exit("usage: python -m course_lib.checks.lesson14 FUNCTION.pkl OUT_DIR")
    main = cloudpickle.loads(Path(argv[0]).read_bytes())
    sys.argv = ["train.py", argv[1]]
    main()
    # main() is done: leave without running C++ destructors. PyTorch 2.13's gloo can abort
    # there ("terminate called without an active exception", docs/facts.md), and that is
    # not the learner's code; the course's own ranks end the same way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _entry(sys.argv[1:])
