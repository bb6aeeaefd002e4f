"""Lesson 10's second exercise (skip a NaN batch on every rank): the check accepts the worked
solution and two differently written correct answers, and rejects plausible wrong answers,
each with the hint that names what that answer did. (The first exercise's cases are in
tests/test_checks_lesson10.py.)"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from checking import check_helpers

from course_lib.checks.lesson10 import check_skip_bad_batches

NOTEBOOK = "10_hangs_and_desync.ipynb"
FAST = 15  # seconds a launch; a hang ends at the check's short process-group timeout

solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)


def _train(model, batches, skip):
    """The exercise's loop with the decision `skip(loss)` -> bool taken before backward."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        if skip(loss):
            continue
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def nan_spreads_in_the_sum(model, batches):
    """Correct, written otherwise: all-reduce the loss itself; a NaN anywhere makes the sum NaN."""
    def skip(loss):
        total = loss.detach().clone()
        dist.all_reduce(total)
        return not torch.isfinite(total).item()
    return _train(model, batches, skip)


def skip_on_the_gradients(model, batches):
    """Correct, as GradScaler does it: backward on every rank (DDP's all-reduce puts the NaN
    in every rank's gradient), then skip the step and clear the gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        F.mse_loss(model(x), y).backward()
        if all(torch.isfinite(p.grad).all() for p in model.parameters()):
            optimizer.step()
            steps += 1
        optimizer.zero_grad()
    dist.barrier()
    return steps


def skips_alone(model, batches):  # the mistake: each rank checks its own loss
    return _train(model, batches, lambda loss: not torch.isfinite(loss).item())


def rank0_decides(model, batches):
    def skip(loss):
        flag = torch.tensor([float(not torch.isfinite(loss).item())])
        dist.broadcast(flag, src=0)
        return bool(flag.item())
    return _train(model, batches, skip)


def all_must_be_bad(model, batches):
    def skip(loss):
        bad = torch.tensor([float(not torch.isfinite(loss).item())])
        dist.all_reduce(bad, op=dist.ReduceOp.MIN)  # skips only when every rank is bad
        return bool(bad.item())
    return _train(model, batches, skip)


def stops_at_the_first_bad_batch(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        bad = torch.tensor([float(not torch.isfinite(loss).item())])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item():
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def flag_only_on_the_bad_rank(model, batches):
    def skip(loss):
        if torch.isfinite(loss).item():
            return False
        bad = torch.ones(1)
        dist.all_reduce(bad)  # only the rank that saw the NaN calls it
        return True
    return _train(model, batches, skip)


@pytest.mark.parametrize("fn", ["solution", nan_spreads_in_the_sum, skip_on_the_gradients])
def test_skip_bad_batches_accepts(fn, capsys):
    fn = solution("skip_bad_batches") if fn == "solution" else fn
    accepts(check_skip_bad_batches, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (skips_alone, "on 2 ranks rank 1 skipped alone"),
    (skips_alone, "rank 0 issued 10, rank 1 issued 9"),
    (skips_alone, "rank 0 waited in all_reduce"),
    (rank0_decides, "the model's weights are NaN"),
    (all_must_be_bad, "the model's weights are NaN"),
    (stops_at_the_first_bad_batch, "`continue`, not `break`"),
    (flag_only_on_the_bad_rank, "the ranks parted at collective #"),
])
def test_skip_bad_batches_rejects(fn, hint, capsys):
    rejects(check_skip_bad_batches, fn, hint, capsys)
