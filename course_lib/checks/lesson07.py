"""Checks for lesson 07's exercise: one optimizer step of gradient accumulation under DDP,
with one all-reduce per step and the gradient of one process on the global batch."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks import collectives
from course_lib.checks.common import (
    CHECK_TIMEOUT,
    RecordingSGD,
    Rejected,
    at_world_sizes,
    check,
    close,
    differing,
    flat_grad,
    same,
    state_snapshot,
)
from course_lib.telemetry import Recorder
from course_lib.words import listing

SEED = 7
LR = 0.1
STEPS = 3
# Per world size, the micro-batch sizes of every rank's share of a step: equal on 2 ranks,
# a short last micro-batch on 3 (as a DataLoader without drop_last gives).
CASES = {2: (4, 4, 4), 3: (4, 4, 4, 2)}
WORLD_SIZES = tuple(CASES)


def make_model() -> nn.Module:
    """The check's model, the same initial weights in every process (kernel's state kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of one optimizer step (every rank and the kernel build the same)."""
    gen = torch.Generator().manual_seed(SEED * 100 + step)
    x = torch.randn(size, 6, generator=gen)
    return x, (x[:, :3].sum(1, keepdim=True)).cos()


def micro_batches(step: int, rank: int, world_size: int,
                  sizes: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank `rank`'s share of the step's global batch, split into micro-batches of `sizes`."""
    mine = sum(sizes)
    x, y = global_batch(step, world_size * mine)
    part = slice(rank * mine, (rank + 1) * mine)
    return list(zip(x[part].split(list(sizes)), y[part].split(list(sizes))))


@contextmanager
def _watched_no_sync(model: DDP, entries: list[int]):
    """Count the learner's `with model.no_sync():` entries (instance attribute over the
    method, for this run only)."""
    original = model.no_sync

    @contextmanager
    def no_sync():
        entries.append(1)
        with original():
            yield

    model.no_sync = no_sync
    try:
        yield
    finally:
        del model.no_sync


def _train_on_rank(fn: Callable, sizes: tuple[int, ...]) -> dict[str, Any]:
    """fn(model, optimizer, micro_batches) for STEPS steps; per step what it did."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model())
    optimizer = RecordingSGD(model.parameters(), lr=LR)
    rec = Recorder()
    rec.watch_ddp(model, grads=False)  # one row per bucket all-reduce DDP makes
    synced_forwards: list[bool] = []
    model.register_forward_pre_hook(
        lambda module, args: synced_forwards.append(module.require_backward_grad_sync))
    steps = []
    for step in range(STEPS):
        entries: list[int] = []
        synced_forwards.clear()
        before = len(optimizer.seen)
        with rec.step(step), _watched_no_sync(model, entries), \
                collectives.recorded() as calls:
            fn(model, optimizer, micro_batches(step, rank, world_size, sizes))
        params = list(model.parameters())
        steps.append({
            "optimizer_steps": len(optimizer.seen) - before,
            "grads": optimizer.seen[before:],
            "left_grad": float(flat_grad(params).abs().max()),
            "forwards": len(synced_forwards),
            "synced_forwards": sum(synced_forwards),
            "synced_at": [i for i, synced in enumerate(synced_forwards) if synced],
            "no_sync_entries": len(entries),
            "collectives": collectives.count(calls),  # DDP's hook's all-reduces included
            "weights": state_snapshot(model.module),
        })
    comms = rec.telemetry().comms
    for step, record in enumerate(steps):
        record["allreduces"] = int((comms["step"] == step).sum())
        record["own_collectives"] = record.pop("collectives") - record["allreduces"]
    return {"steps": steps}


# -- the truth, computed in the kernel ----------------------------------------------------------

def _weighted_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    """The gradient of sum_j weights_j * (model(x_j) - y_j)^2 at the model's weights."""
    model.zero_grad()
    ((model(x) - y).squeeze(1).square() * weights).sum().backward()
    grad = flat_grad(list(model.parameters()))
    model.zero_grad()
    return grad


def sample_weights(world_size: int, sizes: tuple[int, ...], rule: str) -> torch.Tensor:
    """Each sample's weight in the loss a rule gives, averaged over ranks as DDP does."""
    k, total = len(sizes), sum(sizes)
    per_micro = {
        "global mean": [1 / total] * k,  # the truth
        "mean / k": [1 / (k * s) for s in sizes],  # the mean of the micro-batch means
        "mean, not / k": [1 / s for s in sizes],  # the sum of the micro-batch means
        "last, / k": [0.0] * (k - 1) + [1 / (k * sizes[-1])],  # zero_grad in the loop
        "last only": [0.0] * (k - 1) + [1 / sizes[-1]],
    }[rule]
    rank_share = torch.cat([torch.full((s,), w) for s, w in zip(sizes, per_micro)])
    return rank_share.repeat(world_size) / world_size


RULES = ("mean / k", "mean, not / k", "last, / k", "last only")


def reference(world_size: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """One process on the global batches: the gradient and weights of every step, and at
    step 0 the gradient each wrong rule of RULES gives."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads, weights, wrong = [], [], {}
    for step in range(STEPS):
        x, y = global_batch(step, world_size * sum(sizes))
        if step == 0:
            wrong = {rule: _weighted_grad(model, x, y, sample_weights(world_size, sizes, rule))
                     for rule in RULES}
        nn.functional.mse_loss(model(x), y).backward()
        grads.append(flat_grad(list(model.parameters())))
        optimizer.step()
        optimizer.zero_grad()
        weights.append(state_snapshot(model))
    return {"grads": grads, "weights": weights, "wrong": wrong}


# -- the check ----------------------------------------------------------------------------------

@check
def check_train_step(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, optimizer, micro_batches) must make one optimizer step of gradient
    accumulation with one all-reduce, and the weights of one process on the global batch."""
    for n, results in at_world_sizes(_train_on_rank, fn, WORLD_SIZES,
                                     lambda n: (CASES[n],), timeout):
        _judge(results, n, CASES[n], reference(n, CASES[n]))
    cases = "; ".join(f"{n} ranks, micro-batches of {', '.join(map(str, s))}"
                      for n, s in CASES.items())
    return (f"{STEPS} optimizer steps ({cases}): one all-reduce per step, and every "
            "rank's gradients and weights equal one process's on the global batch.")


def _judge(results: list[dict[str, Any]], n: int, sizes: tuple[int, ...],
           want: dict[str, Any]) -> None:
    k = len(sizes)
    where = f"on {n} ranks with micro-batches of {listing(sizes)} samples, "
    for result in results:
        _judge_calls(result["steps"][0], where, k)
    _judge_last_synced([result["steps"][0] for result in results], where, k)
    for rank, result in enumerate(results):
        first = result["steps"][0]
        _judge_gradient(first["grads"][0], want, rank, where, k, sizes)
        leftover = False  # p.grad held a gradient when this step began
        for step, record in enumerate(result["steps"]):
            wrong = differing(record["weights"], want["weights"][step])
            if wrong and leftover:
                raise Rejected(f"{where}rank {rank}'s weights after step {step} are wrong, and "
                               "p.grad still held the previous step's gradient when this "
                               "step began, so backward added the new one to it: call "
                               "optimizer.zero_grad() once per step (after optimizer.step(), "
                               "or at the start of the step).")
            if wrong:
                raise Rejected(f"{where}rank {rank}'s {', '.join(wrong)} after step {step} "
                               "differ from one process's weights.")
            leftover = record["left_grad"] != 0.0


def _judge_calls(record: dict[str, Any], where: str, k: int) -> None:
    """One optimizer step and one all-reduce per train_step(), made by DDP."""
    stepped = record["optimizer_steps"]
    if stepped != 1:
        raise Rejected(f"{where}train_step() called optimizer.step() {stepped} times; call "
                       "it once, after the last micro-batch's backward.")
    calls, own = record["allreduces"], record["own_collectives"]
    if own:
        raise Rejected(f"{where}you called {own} collective(s) yourself (dist.all_reduce "
                       "...) in one step: DDP averages the gradients itself in the backward "
                       "outside no_sync(); leave the communication to it.")
    if calls == 0:
        raise Rejected(f"{where}your step made 0 all-reduces: every micro-batch ran inside "
                       "no_sync(), so the ranks stepped with their own gradients and drift "
                       "apart. Run the last micro-batch outside no_sync().")
    if calls == 1:
        return
    if record["no_sync_entries"] and record["synced_forwards"] == record["forwards"]:
        raise Rejected(f"{where}you made {calls} all-reduces per optimizer step although you "
                       f"entered no_sync() {record['no_sync_entries']} times: every forward "
                       "ran outside it. DDP decides in forward() whether the next backward "
                       "all-reduces: put model(x) inside the with block too.")
    raise Rejected(f"{where}you made {calls} all-reduces per optimizer step (k = {k}); with "
                   f"no_sync() around the first {k - 1} micro-batches (forward and backward) "
                   "it is 1.")


def _judge_last_synced(first: list[dict[str, Any]], where: str, k: int) -> None:
    """The ranks must step with the same gradient; when they do not and the one synced
    forward was not the last micro-batch's, name it (the all-reduce count was right)."""
    grads = [record["grads"][0] for record in first]
    apart = [rank for rank in range(1, len(grads)) if not same(grads[rank], grads[0])]
    hint = apart and collectives.early_sync(where, apart[0], first[0]["synced_at"], k,
                                            "after the step")
    if hint:
        raise Rejected(hint)


def _judge_gradient(got: torch.Tensor, want: dict[str, Any], rank: int, where: str, k: int,
                    sizes: tuple[int, ...]) -> None:
    """Rank `rank`'s step-0 gradient against one process's, naming the rule it followed."""
    truth = want["grads"][0]
    if same(got, truth):
        return
    ratio = float(got.norm() / truth.norm())
    lead = f"{where}rank {rank}'s gradient at step 0 "
    unequal = len(set(sizes)) > 1
    if same(got, want["wrong"]["mean / k"]) and unequal:
        raise Rejected(f"{lead}is the mean of the {k} micro-batch means, not the mean over "
                       f"the {sum(sizes)} samples: with micro-batches of unequal sizes, sum "
                       "each micro-batch's loss (reduction='sum') and divide by the number "
                       "of samples in the whole step.")
    if same(got, want["wrong"]["mean, not / k"]):
        raise Rejected(f"{lead}is {ratio:.2f} times one process's: you added the {k} "
                       f"micro-batch losses without dividing by k = {k}, a learning rate "
                       f"{k} times larger. Divide each micro-batch's loss by k (by its share "
                       "of the step's samples when the sizes differ).")
    if same(got, want["wrong"]["last, / k"]) or same(got, want["wrong"]["last only"]):
        raise Rejected(f"{lead}is the gradient of the last micro-batch only: zero_grad() "
                       "inside the micro-batch loop wipes what the earlier backwards "
                       "accumulated. Zero once per step, after optimizer.step().")
    for n in range(2, 5):
        if close(ratio, 1 / n, rtol=1e-3) and same(got * n, truth):
            raise Rejected(f"{lead}is 1/{n} of one process's: DDP already averages over "
                           "the ranks; do not divide the loss by the world size.")
    raise Rejected(f"{lead}differs from one process's on the global batch (norm ratio "
                   f"{ratio:.3g}): the loss of a step is the mean squared error over all "
                   "its samples.")
