"""Lesson 07's check accepts the worked solution and differently written correct answers, and
rejects plausible wrong answers, each with the hint that names what went wrong."""

from contextlib import nullcontext

import pytest
import torch.distributed as dist
from torch import nn
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson07 import check_train_step

NOTEBOOK = "07_gradient_accumulation.ipynb"
FAST = 20  # seconds a launch: every answer here finishes (or fails) well within it

judged = verdicts_for(NOTEBOOK, FAST)


def step_first_then_last(model, optimizer, micro_batches):
    *first, last = micro_batches
    total = sum(len(x) for x, _ in micro_batches)
    with model.no_sync():
        for x, y in first:
            (nn.functional.mse_loss(model(x), y, reduction="sum") / total).backward()
    x, y = last
    (nn.functional.mse_loss(model(x), y, reduction="sum") / total).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def step_weighted_means(model, optimizer, micro_batches):
    optimizer.zero_grad()
    total = sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        sync = i + 1 == len(micro_batches)
        with nullcontext() if sync else model.no_sync():
            out = model(x)
            loss = nn.functional.mse_loss(out, y) * len(x) / total
        loss.backward()  # backward outside no_sync(): the forward decided
    optimizer.step()
    optimizer.zero_grad()


def step_zeroing_first(model, optimizer, micro_batches):
    """Correct: zero_grad() at the start of the step, as PyTorch's examples write it."""
    optimizer.zero_grad()
    step_first_then_last(model, optimizer, micro_batches)
    for x, y in micro_batches[:1]:  # leave a gradient behind: the next step zeroes it first
        with model.no_sync():
            nn.functional.mse_loss(model(x), y).backward()


def _step(model, optimizer, micro_batches, *, sync="last", divide="samples", zero_in_loop=False,
          forward_outside=False, steps="once"):
    """A step of accumulation with one mistake chosen by keyword."""
    k, total = len(micro_batches), sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        in_no_sync = {"last": not last, "never": False, "always": True}[sync]
        output = model(x) if forward_outside else None
        with model.no_sync() if in_no_sync else nullcontext():
            output = model(x) if output is None else output
            if divide == "samples":
                loss = nn.functional.mse_loss(output, y, reduction="sum") / total
            elif divide == "k":
                loss = nn.functional.mse_loss(output, y) / k
            elif divide == "world":
                loss = nn.functional.mse_loss(output, y, reduction="sum") / total \
                    / dist.get_world_size()
            else:
                loss = nn.functional.mse_loss(output, y)
            loss.backward()
        if zero_in_loop and not last:
            optimizer.zero_grad()
        if steps == "every":
            optimizer.step()
    if steps != "every":
        optimizer.step()
    if steps != "no zero":
        optimizer.zero_grad()


def without_no_sync(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, sync="never")


def forward_outside(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, forward_outside=True)


def all_in_no_sync(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, sync="always")


def not_divided(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, divide="none")


def mean_over_k(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, divide="k")


def over_world_size(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, divide="world")


def zero_in_loop(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, zero_in_loop=True)


def step_every_micro_batch(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, steps="every")


def never_zeroed(model, optimizer, micro_batches):
    _step(model, optimizer, micro_batches, steps="no zero")


def manual_all_reduce(model, optimizer, micro_batches):
    total = sum(len(x) for x, _ in micro_batches)
    with model.no_sync():
        for x, y in micro_batches:
            (nn.functional.mse_loss(model(x), y, reduction="sum") / total).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
    optimizer.zero_grad()


def flag_by_hand(model, optimizer, micro_batches):
    """Correct, written otherwise (a review's answer): DDP's flag set by hand, as no_sync()
    does, and each micro-batch's mean weighed by its share of the samples."""
    total = sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        model.require_backward_grad_sync = i == len(micro_batches) - 1
        loss = nn.functional.mse_loss(model(x), y) * len(x) / total
        loss.backward()
    model.require_backward_grad_sync = True
    optimizer.step()
    optimizer.zero_grad()


def first_synced_not_last(model, optimizer, micro_batches):
    """A review's wrong answer: the FIRST micro-batch outside no_sync(): one all-reduce, and
    the later micro-batches stay on each rank."""
    total = sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with nullcontext() if i == 0 else model.no_sync():
            loss = nn.functional.mse_loss(model(x), y, reduction="sum") / total
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def zero_grad_before_each(model, optimizer, micro_batches):
    """A review's wrong answer: optimizer.zero_grad() before every micro-batch's backward."""
    total = sum(len(x) for x, _ in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        optimizer.zero_grad()
        with nullcontext() if i == len(micro_batches) - 1 else model.no_sync():
            loss = nn.functional.mse_loss(model(x), y, reduction="sum") / total
            loss.backward()
    optimizer.step()


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
TRAIN_STEP = [
    (Solution("train_step"), ACCEPTED),
    (step_first_then_last, ACCEPTED),
    (step_weighted_means, ACCEPTED),
    (step_zeroing_first, ACCEPTED),
    (flag_by_hand, ACCEPTED),
    (first_synced_not_last, "rank 0's and rank 1's gradients differ after the step: your one "
                            "all-reduce came with micro-batch 1 of 3"),
    (without_no_sync, "on 2 ranks with micro-batches of 4, 4 and 4 samples, you made 3 "
                      "all-reduces per optimizer step (k = 3); with no_sync() around the first "
                      "2 micro-batches (forward and backward) it is 1"),
    (forward_outside, "you made 3 all-reduces per optimizer step although you entered "
                      "no_sync() 2 times: every forward ran outside it"),
    (all_in_no_sync, "your step made 0 all-reduces: every micro-batch ran inside no_sync()"),
    (not_divided, "is 3.00 times one process's: you added the 3 micro-batch losses without "
                  "dividing by k = 3"),
    (mean_over_k, "on 3 ranks with micro-batches of 4, 4, 4 and 2 samples, rank 0's gradient "
                  "at step 0 is the mean of the 4 micro-batch means, not the mean over the 14 "
                  "samples"),
    (over_world_size, "is 1/2 of one process's: DDP already averages over the ranks"),
    (zero_in_loop, "is the gradient of the last micro-batch only: zero_grad() inside the "
                   "micro-batch loop"),
    (zero_grad_before_each, "is the gradient of the last micro-batch only"),
    (step_every_micro_batch, "train_step() called optimizer.step() 3 times"),
    (never_zeroed, "p.grad still held the previous step's gradient when this step began"),
    (manual_all_reduce, "you called 4 collective(s) yourself"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_train_step, TRAIN_STEP))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)
