"""Lesson 17's check accepts the worked solution and differently written correct answers, and
rejects plausible wrong answers to the hand-written GPipe step, each with the hint that names
what went wrong."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson17 import check_gpipe_step

NOTEBOOK = "17_pipeline_parallel.ipynb"
FAST = 30  # seconds a launch: the answers that hang fail after the check's 5 s

judged = verdicts_for(NOTEBOOK, FAST)


def _gpipe(part, x, y, m, *, divide=True, grads_over_m=False, requires_grad=True,
           send_grads=True, zero_each=False, share="broadcast", reverse=False, sends="blocking",
           backward_at_once=False):
    """A GPipe step by hand with one mistake (or one variation) chosen by keyword."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world_size - 1
    pending = []

    def send(tensor, dst):
        if sends == "blocking":
            dist.send(tensor, dst=dst)
        else:
            pending.append(dist.isend(tensor, dst=dst))

    def backward(inp, out):
        if zero_each:
            part.zero_grad()
        if last:
            out.backward()
        elif send_grads:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
        if not first and send_grads:
            send(inp.grad, rank - 1)

    kept = []
    for xs, ys in zip(x.chunk(m), y.chunk(m)):
        inp = xs
        if not first:
            inp = torch.empty_like(xs)
            dist.recv(inp, src=rank - 1)
            if requires_grad:
                inp.requires_grad_()
        out = part(inp)
        if last:
            out = nn.functional.mse_loss(out, ys) / (m if divide else 1)
        else:
            send(out.detach(), rank + 1)
        kept.append((inp, out))
        if backward_at_once and last:
            backward(inp, out)
    if not (backward_at_once and last):
        for inp, out in (reversed(kept) if reverse else kept):
            backward(inp, out)
    for work in pending:
        work.wait()
    if grads_over_m:
        for p in part.parameters():
            p.grad /= m
    loss = sum(out.detach() for _, out in kept) / (1 if divide else m) if last else torch.zeros(())
    if share == "broadcast":
        dist.broadcast(loss, src=world_size - 1)
    elif share == "all_reduce":
        dist.all_reduce(loss)  # the others add zeros
    elif share == "none" and not last:
        return None
    return loss.item()


def with_isend_and_all_reduce(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, sends="isend", share="all_reduce")


def backward_in_reverse(part, x, y, n_micro):
    """Correct: every stage runs the backwards last micro-batch first (the same order on both
    sides of every send)."""
    return _gpipe(part, x, y, n_micro, reverse=True)


def summed_then_gradients_divided(part, x, y, n_micro):
    """Correct: the micro-batch losses added, the gradients divided by m afterwards (what the
    schedules' scale_grads=True does)."""
    return _gpipe(part, x, y, n_micro, divide=False, grads_over_m=True)


def losses_summed(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, divide=False)


def divided_twice(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, grads_over_m=True)


def loss_left_on_last_stage(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, share="none")


def loss_not_shared(part, x, y, n_micro):
    """Each rank returns its own `loss` variable: zero everywhere but on the last stage."""
    return _gpipe(part, x, y, n_micro, share="own")


def received_without_requires_grad(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, requires_grad=False)


def backward_on_last_stage_only(part, x, y, n_micro):
    """As if autograd crossed ranks: only the last stage runs a backward."""
    return _gpipe(part, x, y, n_micro, send_grads=False)


def zero_grad_per_micro_batch(part, x, y, n_micro):
    return _gpipe(part, x, y, n_micro, zero_each=True)


def last_stage_backward_at_once(part, x, y, n_micro):
    """The last stage runs each micro-batch's backward right after its forward (1F1B on one
    side), with blocking sends: it sends a gradient while stage n - 2 sends an activation."""
    return _gpipe(part, x, y, n_micro, backward_at_once=True)


def gradients_never_sent(part, x, y, n_micro):
    """The backward waits for output gradients, but no stage sends its input's gradient."""
    rank = dist.get_rank()
    first, last = rank == 0, rank == dist.get_world_size() - 1
    kept = []
    for xs, ys in zip(x.chunk(n_micro), y.chunk(n_micro)):
        inp = xs if first else torch.empty_like(xs)
        if not first:
            dist.recv(inp, src=rank - 1)
            inp.requires_grad_()
        out = part(inp)
        if last:
            out = nn.functional.mse_loss(out, ys) / n_micro
        else:
            dist.send(out.detach(), dst=rank + 1)
        kept.append(out)
    for out in kept:
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=rank + 1)
            out.backward(grad)
    return 0.0


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
GPIPE_STEP = [
    (Solution("gpipe_step"), ACCEPTED),
    (with_isend_and_all_reduce, ACCEPTED),
    (backward_in_reverse, ACCEPTED),
    (summed_then_gradients_divided, ACCEPTED),
    (losses_summed, "on 2 stages with 4 micro-batches, stage 0's gradients are 4 times one "
                    "process's: the 4 micro-batch losses were added"),
    (divided_twice, "stage 0's gradients are 1/4 of one process's: divided by n_micro = 4 twice"),
    (loss_left_on_last_stage, "rank 0 returned None: the loss exists only on the last stage"),
    (loss_not_shared, "rank 0 returned the loss 0, one process's is"),
    (received_without_requires_grad, "a rank called send with None"),
    (backward_on_last_stage_only, "stage 0's parameters 0.0.weight and 0.0.bias got no "
                                  "gradient"),
    (zero_grad_per_micro_batch, "stage 0's gradients are the last micro-batch's only"),
    (last_stage_backward_at_once, "two neighbours both sent and neither received"),
    (gradients_never_sent, "a receive whose matching send never came"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_gpipe_step, GPIPE_STEP))
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)
