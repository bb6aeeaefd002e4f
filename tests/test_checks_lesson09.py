"""Lesson 09's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong AMP + accumulation steps, each with the hint that names what it did."""

from contextlib import ExitStack, nullcontext

import pytest
import torch
import torch.distributed as dist
from torch import nn
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson09 import check_amp_step

NOTEBOOK = "09_mixed_precision.ipynb"
FAST = 20  # seconds a launch: every answer here finishes (or fails) well within it

judged = verdicts_for(NOTEBOOK, FAST)


def amp_step_exit_stack(model, optimizer, scaler, micro_batches, max_norm):
    *first, last = micro_batches
    k = len(micro_batches)
    for x, y in first:
        with ExitStack() as stack:
            stack.enter_context(model.no_sync())
            stack.enter_context(torch.amp.autocast("cpu", dtype=torch.float16))
            scaled = scaler.scale(model(x, y) / k)
        scaled.backward()  # the forward inside no_sync() decided: no all-reduce
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = model(*last).div(k)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=False)


def amp_step_zeroing_first(model, optimizer, scaler, micro_batches, max_norm):
    """Correct: zero_grad() at the top of the step, as PyTorch's AMP examples write it."""
    optimizer.zero_grad()
    _step(model, optimizer, scaler, micro_batches, max_norm, zero=False)


def _step(model, optimizer, scaler, micro_batches, max_norm, *, scaled=True, use_scaled=True,
          divide=True, sync_last_only=True, unscale="before clip", clip=True,
          update="once", step="once", autocast=torch.float16, zero=True):
    """An AMP accumulation step with one mistake chosen by keyword."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        with ExitStack() as stack:
            if sync_last_only and not last:
                stack.enter_context(model.no_sync())
            with torch.autocast("cpu", dtype=autocast or torch.float16,
                                enabled=autocast is not None):
                loss = model(x, y) / (k if divide else 1)
            if not scaled:
                loss.backward()
            elif use_scaled:
                scaler.scale(loss).backward()
            else:
                scaler.scale(loss)
                loss.backward()
        if unscale == "every micro-step":
            scaler.unscale_(optimizer)
        if step == "every micro-step":
            scaler.step(optimizer)
        if update == "every micro-step":
            scaler.update()
    if unscale == "before clip":
        scaler.unscale_(optimizer)
    if clip:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if step == "once":
        scaler.step(optimizer) if scaled else optimizer.step()
    if update == "once" and scaled:
        scaler.update()
    if zero:
        optimizer.zero_grad()


def no_scaler(*args):
    _step(*args, scaled=False, unscale="never")


def no_autocast(*args):
    _step(*args, autocast=None)


def bf16_autocast(*args):
    _step(*args, autocast=torch.bfloat16)


def never_zeroed(*args):
    _step(*args, zero=False)


def scaled_loss_unused(*args):
    _step(*args, use_scaled=False)


def clip_before_unscale(*args):
    _step(*args, unscale="never")


def update_every_micro_step(*args):
    _step(*args, update="every micro-step")


def step_every_micro_step(*args):
    _step(*args, unscale="never", step="every micro-step", update="every micro-step")


def unscale_every_micro_step(*args):
    _step(*args, unscale="every micro-step")


def not_divided(*args):
    _step(*args, divide=False)


def no_clip(*args):
    _step(*args, clip=False)


def without_no_sync(*args):
    _step(*args, sync_last_only=False)


def summed_loss(model, optimizer, scaler, micro_batches, max_norm):
    k = len(micro_batches)
    with torch.autocast("cpu", dtype=torch.float16):
        total = sum(model(x, y) for x, y in micro_batches) / k
    scaler.scale(total).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def backward_in_autocast(model, optimizer, scaler, micro_batches, max_norm):
    """Correct, written otherwise (a review's answer): zero_grad first, scale(loss) / k, and
    backward inside the autocast block."""
    optimizer.zero_grad(set_to_none=True)
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ExitStack() as stack:
            if i < k - 1:
                stack.enter_context(model.no_sync())
            stack.enter_context(torch.autocast("cpu", dtype=torch.float16))
            (scaler.scale(model(x, y)) / k).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def _review_step(model, optimizer, scaler, micro_batches, max_norm, synced, divisor):
    """A review's answers: the micro-batch `synced(i, k)` outside no_sync(), loss / divisor."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with nullcontext() if synced(i, k) else model.no_sync():
            with torch.autocast("cpu", dtype=torch.float16):
                loss = model(x, y) / divisor(k)
            scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def divided_by_world_size(*args):
    """A review's wrong answer: loss / (k * world size), as if DDP summed."""
    _review_step(*args, lambda i, k: i == k - 1, lambda k: k * dist.get_world_size())


def first_synced_not_last(*args):
    """A review's wrong answer: the first micro-batch outside no_sync(), the rest local."""
    _review_step(*args, lambda i, k: i == 0, lambda k: k)


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
AMP_STEP = [
    (Solution("amp_step"), ACCEPTED),
    (amp_step_exit_stack, ACCEPTED),
    (amp_step_zeroing_first, ACCEPTED),
    (backward_in_autocast, ACCEPTED),
    (no_scaler, "scaler.scale() was never called: in fp16 the small gradients underflow"),
    (scaled_loss_unused, "% of the gradients the optimizer stepped with were non-zero (fp32: "
                         "100%): they underflowed in fp16"),
    (clip_before_unscale, "scaler.unscale_(optimizer) was never called, so the clip saw the "
                          "scaled gradients"),
    (update_every_micro_step, "scaler.update() ran before any scaler.unscale_()/scaler.step()"),
    (step_every_micro_step, "your scaler calls after the micro-batches were ['step', 'update', "
                            "'step', 'update', 'step', 'update']"),
    (unscale_every_micro_step, "scaler.unscale_() ran twice in one optimizer step"),
    (not_divided, "on 2 ranks, rank 0, step 0: the gradient is 3.00 times the true one: "
                  "divide each micro-batch's loss by k = 3"),
    (divided_by_world_size, "on 2 ranks, rank 0, step 0: the gradient is 0.50 times the true "
                            "one, 1/2 on 2 ranks: DDP already averages the gradients"),
    (first_synced_not_last, "rank 0's and rank 1's gradients differ at step 0: your one "
                            "all-reduce came with micro-batch 1 of 3"),
    (no_clip, "on 3 ranks, rank 0, step 0: the gradient's norm"),
    (without_no_sync, "DDP made 3 all-reduces in one optimizer step of 3 micro-batches"),
    (summed_loss, "scaler.scale() ran 1 times for 3 micro-batches"),
    (no_autocast, "the model's forwards computed in torch.float32, not only torch.float16: "
                  "run each micro-batch's forward under torch.autocast"),
    (bf16_autocast, "computes in bfloat16, CPU autocast's default; pass dtype=torch.float16"),
    (never_zeroed, "step 1: p.grad still held the previous step's gradient when this step's "
                   "first backward ran"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_amp_step, AMP_STEP))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)
