"""Checks for lesson 17's exercise: one GPipe training step written by hand with send and
receive, run on 2 and 3 stages (one per rank) and compared with one process on the whole
batch: every stage's gradients, and the loss every rank returns. Its hints name what this
answer did: the micro-batch losses summed or divided twice, the loss left on the last stage,
a gradient that never flowed back, only one micro-batch's gradient, or a deadlock."""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, close, same
from course_lib.words import listing, ranks

SEED = 17
WIDTH = 8
BLOCKS = 6
ROWS = 12
# Stages -> micro-batches: 4 on 2 stages, 3 on 3 (so that an answer that hard-codes either
# number, or assumes m >= p, fails somewhere).
CASES = {2: 4, 3: 3}
WORLD_SIZES = tuple(CASES)
# A rank waiting for a message that never comes fails after this many seconds, with gloo's
# "Timed out waiting ... for recv (send) operation", so the hint can say where each rank was.
HANG_AFTER_S = 5.0

# PyTorch's error when a rank sends None (the received activation had no gradient).
SENT_NONE = "Expected parameter `tensor` of type torch.Tensor"
# torch's frame of a point-to-point call in a traceback or a stack (innermost last).
P2P_FRAME = re.compile(r"distributed_c10d\.py\",? line \d+,? in (send|recv)\b")
SENT_NONE_HINT = ("a rank called send with None: the received activation's .grad was None, "
                  "because the buffer you received into does not require grad. Call "
                  "requires_grad_() on it after recv, before the stage's forward.")


def make_model() -> nn.Sequential:
    """Six blocks and a head, the same weights in every process (the kernel's state kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS)]
        return nn.Sequential(*blocks, nn.Linear(WIDTH, 1))


def stage_of(model: nn.Sequential, rank: int, world_size: int) -> nn.Sequential:
    """Rank `rank`'s consecutive blocks; the last stage takes the rest and the head."""
    *blocks, head = model
    per = len(blocks) // world_size
    if rank == world_size - 1:
        return nn.Sequential(*blocks[rank * per:], head)
    return nn.Sequential(*blocks[rank * per:(rank + 1) * per])


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch, the same in every process."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(ROWS, WIDTH, generator=gen)
    return x, x[:, :3].sum(1, keepdim=True).cos()


def _plain(value: Any) -> Any:
    """The returned loss as a float when it is a number, else a description of it."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None if value is None else f"a {type(value).__name__}"


def _step_on_rank(fn: Callable, n_micro: int) -> dict[str, Any]:
    """fn(part, x, y, n_micro) on this rank's stage; what it left and returned."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model()
    part = stage_of(model, rank, world_size)
    x, y = batch()
    returned = fn(part, x.clone(), y.clone(), n_micro)
    mine = {id(p) for p in part.parameters()}
    grads = {name: None if p.grad is None else p.grad.detach().clone()
             for name, p in model.named_parameters() if id(p) in mine}
    return {"loss": _plain(returned), "grads": grads}


# -- the truth, computed in the kernel ----------------------------------------------------------

def reference(n_micro: int) -> dict[str, Any]:
    """One process on the whole batch: the loss and every gradient; and the gradients of an
    answer that kept only the last micro-batch's (its loss divided by m)."""
    model = make_model()
    x, y = batch()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = _grads(model)
    model.zero_grad()
    (nn.functional.mse_loss(model(x.chunk(n_micro)[-1]), y.chunk(n_micro)[-1]) / n_micro).backward()
    return {"loss": loss.item(), "grads": grads, "last_only": _grads(model)}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for name, p in model.named_parameters()}


# -- the check ----------------------------------------------------------------------------------

@check
def check_gpipe_step(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(part, x, y, n_micro) runs one GPipe step of this rank's stage with send and receive:
    it must leave one process's gradients (mean squared error over the whole batch) in every
    stage's parameters and return that loss on every rank. Run on 2 and 3 stages."""
    for n, results in _runs(fn, timeout):
        _judge(results, n, CASES[n], reference(CASES[n]))
    cases = " and ".join(f"{n} stages ({m} micro-batches)" for n, m in CASES.items())
    return (f"on {cases}: every stage's gradients equal one process's on the whole batch, and "
            "every rank returned the batch's loss.")


def _runs(fn: Callable, timeout: float):
    """at_world_sizes over CASES, a hang turned into a hint that says where each rank waited."""
    sizes = iter(WORLD_SIZES)
    runs = at_world_sizes(_step_on_rank, fn, WORLD_SIZES, lambda n: (CASES[n],), timeout,
                          hang_after=HANG_AFTER_S, known=[(SENT_NONE, SENT_NONE_HINT)])
    while True:
        n = next(sizes, None)
        try:
            yield next(runs)
        except StopIteration:
            return
        except Rejected as rejected:
            raise Rejected(_waits_hint(rejected, n) or str(rejected), rejected.failure,
                           kind=rejected.kind) from None


def _waits_hint(rejected: Rejected, n: int | None) -> str | None:
    """Where each rank waited when its send or receive failed (gloo gave up, or the peer
    had returned and closed the connection), or None when no rank failed in one."""
    failure = rejected.failure
    if failure is None or not (failure.consequence or failure.timed_out):
        return None  # a rank's own error is the cause: its hint stands
    waits = {f.rank: op for f in failure.error.failures if (op := _p2p_op(f))}
    if not waits:
        return None
    run = failure.error.run
    returned = list(run.returned) if run is not None else []
    where = "; ".join(f"rank {r} in a {op}" for r, op in sorted(waits.items()))
    if returned:
        where += f"; {ranks(returned)} had returned"
    lead = f"on {n} stages the ranks stopped waiting for each other ({where}): "
    if len(waits) > 1 and set(waits.values()) == {"send"}:
        why = ("two neighbours both sent and neither received. A send returns only once the "
               "peer receives it: in GPipe, run every forward (receive, compute, send) "
               "before any backward, on every stage.")
    else:
        why = ("a receive whose matching send never came. Every recv needs a send on the "
               "neighbour, in the same order: activations forward to rank + 1, each "
               "micro-batch's input gradient back to rank - 1.")
    return failure.explained(lead + why)


def _p2p_op(failure: Any) -> str | None:
    """"send" or "recv" when this rank failed inside dist.send or dist.recv: gloo's timeout
    names the operation, and torch's own frame names the call."""
    for op in ("send", "recv"):
        if f"for {op} operation" in failure.message:
            return op
    found = P2P_FRAME.findall(f"{failure.traceback}\n{failure.stack}")
    return found[-1] if found else None


def _judge(results: list[dict[str, Any]], n: int, m: int, want: dict[str, Any]) -> None:
    where = f"on {n} stages with {m} micro-batches, "
    for rank, result in enumerate(results):
        _judge_grads(result["grads"], want, rank, n, m, where)
    _judge_losses([result["loss"] for result in results], want["loss"], n, m, where)


def _judge_grads(grads: dict[str, Any], want: dict[str, Any], rank: int, n: int, m: int,
                 where: str) -> None:
    missing = [name for name, g in grads.items() if g is None or not g.abs().sum()]
    if missing:
        behind = "the last stage" if rank < n - 1 else "its loss"
        raise Rejected(f"{where}stage {rank}'s parameters {listing(missing[:2])} got no "
                       f"gradient: the backward from {behind} never reached them. Receive "
                       "each micro-batch's output gradient from rank + 1 and call "
                       "out.backward(grad) with it; send the input's .grad to rank - 1.")
    names = list(grads)
    got = torch.cat([grads[k].flatten() for k in names])
    truth = torch.cat([want["grads"][k].flatten() for k in names])
    if same(got, truth):
        return
    ratio = float(got.norm() / truth.norm())
    lead = f"{where}stage {rank}'s gradients are "
    if close(ratio, m, rtol=1e-3):
        raise Rejected(f"{lead}{m} times one process's: the {m} micro-batch losses were "
                       f"added, each a mean over its rows. Divide each by n_micro = {m} "
                       "(or the summed gradients), once.")
    if close(ratio, 1 / m, rtol=1e-3):
        raise Rejected(f"{lead}1/{m} of one process's: divided by n_micro = {m} twice (the "
                       "loss and again the gradients, or the loss by m * m). Divide once.")
    last = torch.cat([want["last_only"][k].flatten() for k in names])
    if same(got, last) or same(got, last * m):
        raise Rejected(f"{lead}the last micro-batch's only: the earlier micro-batches' "
                       "gradients were lost (zero_grad() inside the loop, or a backward "
                       "that replaced p.grad). Let backward add into p.grad for all "
                       f"{m} micro-batches.")
    raise Rejected(f"{lead}not one process's (norm ratio {ratio:.3g}): each micro-batch's "
                   "backward must use the gradient the next stage sent for that same "
                   "micro-batch, on an output computed from that micro-batch's input.")


def _judge_losses(losses: list[Any], truth: float, n: int, m: int, where: str) -> None:
    last = losses[-1]
    if not isinstance(last, float):
        raise Rejected(f"{where}the last stage returned {last!r}: return the step's loss "
                       "there as a number (a float, or a one-element tensor).")
    none = [r for r, loss in enumerate(losses) if not isinstance(loss, float)]
    if none:
        raise Rejected(f"{where}{ranks(none)} returned {losses[none[0]]!r}: the loss exists "
                       "only on the last stage. Send it to every rank (dist.broadcast from "
                       f"rank {n - 1}) and return it everywhere.")
    wrong = [r for r, loss in enumerate(losses) if not close(loss, truth)]
    if not wrong:
        return
    got = losses[wrong[0]]
    if close(got, truth * m, rtol=1e-3):
        why = f"{m} times the batch's loss: the sum of the micro-batch means, not their mean"
    elif close(got, truth / m, rtol=1e-3) or wrong == list(range(n - 1)):
        why = f"the last stage's loss did not reach it: broadcast it from rank {n - 1}"
    else:
        why = "not the mean squared error over the whole batch"
    raise Rejected(f"{where}{ranks(wrong)} returned the loss {got:.6g}, one process's is "
                   f"{truth:.6g}: {why}.")
