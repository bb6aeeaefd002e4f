"""Lesson 10's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong answers, each with the hint that names what went wrong."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson10 import check_train_until_converged

NOTEBOOK = "10_hangs_and_desync.ipynb"
FAST = 15  # seconds a launch; a hang ends at the check's short process-group timeout

judged = verdicts_for(NOTEBOOK, FAST)


def _train(model, batches, target, stop):
    """The exercise's loop with the stopping rule `stop(loss)` -> bool."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        if stop(loss, target):
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def stop_on_a_flag(model, batches, target):
    """Correct, written otherwise: all-reduce the loss sum and the count, decide, and share a
    flag (a broadcast of rank 0's decision, which is the same on every rank)."""
    def stop(loss, target):
        total = torch.stack([loss.detach(), torch.tensor(1.0)])
        dist.all_reduce(total)
        flag = torch.tensor([float(total[0] / total[1] < target)])
        dist.broadcast(flag, src=0)
        return bool(flag.item())
    return _train(model, batches, target, stop)


def own_loss(model, batches, target):  # the colleague's version: hangs
    return _train(model, batches, target, lambda loss, t: loss.item() < t)


def rank0_decides(model, batches, target):
    def stop(loss, target):
        flag = torch.tensor([float(loss.item() < target)])
        dist.broadcast(flag, src=0)
        return bool(flag.item())
    return _train(model, batches, target, stop)


def summed_not_averaged(model, batches, target):
    def stop(loss, target):
        total = loss.detach().clone()
        dist.all_reduce(total)
        return total.item() < target
    return _train(model, batches, target, stop)


def largest_loss(model, batches, target):
    def stop(loss, target):
        largest = loss.detach().clone()
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return largest.item() < target
    return _train(model, batches, target, stop)


def decides_after_the_step(model, batches, target):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if mean.item() / dist.get_world_size() < target:
            break
    dist.barrier()
    return steps


def backprops_the_averaged_loss(model, batches, target):
    def stop(loss, target):
        dist.all_reduce(loss.detach())  # in place on the loss itself: doubles its value
        return loss.item() / dist.get_world_size() < target
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        if stop(loss, target):
            break
        (loss * dist.get_world_size()).backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def sum_and_count(model, batches, target):
    """Correct, written otherwise (a review's answer): all-reduce [loss, 1], so the count of
    ranks comes with the sum."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        both = torch.stack([loss.detach(), torch.ones(())])
        dist.all_reduce(both)
        if (both[0] / both[1]).item() < target:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def mean_in_place_backprops_it(model, batches, target):
    """A review's wrong answer: the loss all-reduced in place and divided, then
    back-propagated: it decides on the mean, with gradients 1/N of DDP's."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        dist.all_reduce(loss)
        loss = loss / dist.get_world_size()
        if loss.item() < target:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def logs_the_mean_decides_on_its_own(model, batches, target):
    """A review's wrong answer: the mean all-reduced for the log, the decision on the rank's
    own loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        if loss.item() < target:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    dist.barrier()
    return steps


def returns_the_loss(model, batches, target):
    stop_on_a_flag(model, batches, target)
    return 0.25


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
TRAIN_UNTIL_CONVERGED = [
    (Solution("train_until_converged"), ACCEPTED),
    (stop_on_a_flag, ACCEPTED),
    (sum_and_count, ACCEPTED),
    (own_loss, "on 2 ranks the ranks parted at collective #"),
    (own_loss, "each rank decided on its own loss"),
    (rank0_decides, "is where rank 0's own loss falls below it"),
    (summed_not_averaged, "divide by dist.get_world_size()"),
    (largest_loss, "or ReduceOp.MAX, is not the mean"),
    (decides_after_the_step, "One step off"),
    (backprops_the_averaged_loss, "every rank stopped after 8 steps; the loss averaged over "
                                  "all ranks first falls below the target at step 12"),
    (backprops_the_averaged_loss, "back-propagate each rank's own loss, unscaled"),
    (backprops_the_averaged_loss, "your weights are those of gradients 2 times DDP's"),
    (mean_in_place_backprops_it, "You decided on the mean, but your weights are those of "
                                 "gradients 1/2 of DDP's"),
    (logs_the_mean_decides_on_its_own, "each rank decided on its own loss"),
    (returns_the_loss, "return the number of optimizer steps taken"),
]


@pytest.mark.parametrize("check, answer, hint",
                         cases(check_train_until_converged, TRAIN_UNTIL_CONVERGED))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)


def test_the_hang_hint_names_no_victim_as_the_root_cause(capsys):
    """In the hang every rank times out: the one listed first is a victim like the others."""
    result = check_train_until_converged(own_loss, timeout=FAST)
    assert not result.passed and "parted at collective" in result.message
    assert "root cause" not in result.message
