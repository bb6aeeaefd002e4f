"""`check_wrap_model` for lesson 04: the learner wraps a multi-task model (a batch of task "a"
never touches head_b) in DDP, and the check trains it on 2 and 3 ranks against one process on
the whole batches; its hints name the step at which DDP stopped and the head it left without a
gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Rejected,
    at_world_sizes,
    check,
    differing,
    state_snapshot,
)
from course_lib.words import listing

WRAP_WORLD_SIZES = (2, 3)
TASKS = "aabab"  # step 0 leaves head_b unused; the set of used heads changes from step 2 on
BATCH = 12  # per step, split evenly over 2 or 3 ranks (equal shards: DDP's mean is exact)
SEED = 4

# DDP's own error texts, caught on the rank, with what they mean for this job.
UNFINISHED = "Expected to have finished reduction"
GRAPH_CHANGED = "training graph has changed"


class MultiTask(nn.Module):
    """A shared body and one head per task: a batch of task "a" never touches head_b."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.head_a = nn.Linear(16, 3)
        self.head_b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, task: str) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return self.head_a(h) if task == "a" else self.head_b(h)


def task_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step (every rank and the kernel build the same one)."""
    gen = torch.Generator().manual_seed(SEED * 100 + step)
    return torch.randn(BATCH, 6, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)


def train(model: nn.Module, forward: Callable, rank: int, world_size: int,
          progress: dict[str, Any] | None = None) -> None:
    """SGD over TASKS on this rank's share of every step's batch; `progress["step"]` says
    which step is running (so a crash can be placed). The batch goes where the model is: an
    answer that moves the model to the machine's GPU (right on a GPU box) trains there."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    device = next(model.parameters()).device
    for step, task in enumerate(TASKS):
        if progress is not None:
            progress["step"] = step
        x, y = (t.to(device) for t in task_batch(step))
        loss = nn.functional.cross_entropy(forward(x[rank::world_size], task),
                                           y[rank::world_size])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _wrap_on_rank(fn: Callable) -> dict[str, Any]:
    """fn(model) on this rank, then the job; what the learner's wrapper was and did."""
    torch.manual_seed(SEED)
    model = MultiTask()
    wrapped = fn(model)
    if not isinstance(wrapped, DDP):
        return {"type": type(wrapped).__name__}
    if wrapped.module is not model:
        return {"type": "DistributedDataParallel", "other_module": True}
    frozen = [k for k, p in model.named_parameters() if not p.requires_grad]
    progress: dict[str, Any] = {}
    try:
        train(model, wrapped, dist.get_rank(), dist.get_world_size(), progress)
    except RuntimeError as error:  # DDP's own refusals happen alike on every rank
        if UNFINISHED not in str(error) and GRAPH_CHANGED not in str(error):
            raise
        return {"type": "DistributedDataParallel", "frozen": frozen,
                "crash": str(error), "step": progress["step"]}
    return {"type": "DistributedDataParallel", "frozen": frozen,
            "weights": state_snapshot(model)}


def reference_weights() -> dict[str, torch.Tensor]:
    """The weights one process reaches training on the whole batches (run in the kernel,
    whose own random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = MultiTask()
    train(model, model, 0, 1)
    return state_snapshot(model)


@check
def check_wrap_model(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model) must return the model wrapped in DDP so that a job switching between the
    two heads trains on every rank exactly as one process does on the whole batches."""
    want = reference_weights()
    for n, results in at_world_sizes(_wrap_on_rank, fn, WRAP_WORLD_SIZES,
                                     timeout=timeout):
        _judge_wrap(results, want, n)
    return (f"trained {len(TASKS)} steps of tasks {', '.join(TASKS)} on "
            f"{listing(WRAP_WORLD_SIZES)} ranks; every rank's weights equal one "
            "process's.")


def _unused_head(step: int) -> str:
    """The head that step `step` left without a gradient."""
    return "head_b" if TASKS[step] == "a" else "head_a"


def _judge_wrap(results: list[dict[str, Any]], want: dict[str, torch.Tensor], n: int) -> None:
    for rank, got in enumerate(results):
        if got["type"] != "DistributedDataParallel":
            raise Rejected(f"on rank {rank} wrap_model() returned a {got['type']}, not a "
                           "DistributedDataParallel: without DDP the ranks never average "
                           "their gradients. Return DDP(model, ...).")
        if got.get("other_module"):
            raise Rejected("the DDP you returned wraps another module, not the model you "
                           "were given: wrap `model` itself.")
    got = results[0]
    frozen = sorted({k.split(".")[0] for k in got["frozen"]})
    if "crash" in got:
        raise Rejected(_frozen_note(frozen) + _crash_hint(got, n))
    for rank, mine in enumerate(results):
        wrong = differing(mine["weights"], want)
        if not wrong:
            continue
        if frozen:
            raise Rejected(f"{_frozen_note(frozen)}after training, rank {rank}'s "
                           f"{', '.join(wrong)} differ from one process's. Use "
                           "find_unused_parameters=True instead.")
        raise Rejected(f"after training on {n} ranks, rank {rank}'s {', '.join(wrong)} differ "
                       "from what one process computes on the whole batches. Pass the model "
                       "to DDP unchanged, with find_unused_parameters=True.")


def _frozen_note(frozen: list[str]) -> str:
    """The learner froze parts that this job trains: say which, and at which steps."""
    if not frozen:
        return ""
    used = [str(s) for s, t in enumerate(TASKS) if f"head_{t}" in frozen or "body" in frozen]
    return (f"you froze {', '.join(frozen)} (requires_grad False), but this job trains it at "
            f"steps {', '.join(used)}: freezing is for a part the job never trains. Then ")


def _crash_hint(got: dict[str, Any], n: int) -> str:
    """What DDP's refusal at this step of this run means."""
    step, first = got["step"], got["crash"].splitlines()[0]
    if GRAPH_CHANGED in got["crash"]:
        return (f"on {n} ranks, training stopped at step {step} (task {TASKS[step]}): "
                f"\"{first[:90]}...\". static_graph=True promises that every step uses the "
                "same parameters, and this job switches between the heads. Use "
                "find_unused_parameters=True, which finds the unused ones every step.")
    return (f"on {n} ranks, training stopped at step {step} with DDP's \"{UNFINISHED} in the "
            f"prior iteration\": in step {step - 1} (task {TASKS[step - 1]}) "
            f"{_unused_head(step - 1)} got no gradient, so DDP never all-reduced its bucket. "
            "Tell DDP that some parameters may go unused: find_unused_parameters=True.")
