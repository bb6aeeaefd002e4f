"""One job: the check of lesson 09's exercise, one optimizer step of fp16 AMP with gradient
accumulation under DDP, judged by its gradients (non-zero, equal to an fp32 reference up to fp16
rounding), by the order of its GradScaler calls, recorded by a spying scaler, and by the
dtype every forward computed in (fp32 gradients would pass the tolerance: the forward
hook shows whether fp16 autocast really ran)."""

from __future__ import annotations

from collections.abc import Callable
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
    flat_grad,
    state_snapshot,
)
from course_lib.telemetry import Recorder
from course_lib.words import listing

SEED = 9
STEPS = 2
K = 3  # micro-batches per optimizer step
MICRO = 4  # samples per micro-batch
# The model's loss is this small, as in the lesson: in fp16 without loss scaling its gradients
# underflow (measured: 1.4-1.6% of them non-zero), with GradScaler none does (100%).
LOSS_WEIGHT = 3e-7
# max_norm per world size, as a multiple of the true gradient norm at step 0: on 2 ranks the
# clip never binds (a gradient k times too large shows), on 3 it binds (a missing clip shows).
CLIP = {2: 10.0, 3: 0.5}
WORLD_SIZES = tuple(CLIP)
# fp16 computes every product with a 10-bit mantissa, so the AMP gradient differs from the
# fp32 one. Measured for the worked solution: relative errors (|g - ref| / |ref|) of 3.5e-4
# to 6.6e-4 over both steps and world sizes. 1e-2 leaves a 15x margin; every mistake the
# check names is off by far more (a factor of k or of the scale, gradients of 0: 0.7 or more).
TOLERANCE = 1e-2
ORDER = "scale(loss).backward() per micro-batch, then unscale_, clip, step, update"


class TinyLossModel(nn.Module):
    """A regression model whose forward(x, y) returns its micro-batch's mean loss, small."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            self.net = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 32),
                                     nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return LOSS_WEIGHT * nn.functional.mse_loss(self.net(x), y)


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of one optimizer step (every rank and the kernel build the same)."""
    gen = torch.Generator().manual_seed(SEED * 100 + step)
    x = torch.randn(size, 6, generator=gen)
    return x, x[:, :3].sum(1, keepdim=True).cos()


def micro_batches(step: int, rank: int, world_size: int) -> list[tuple[torch.Tensor, ...]]:
    """Rank `rank`'s share of the step's global batch, in K micro-batches of MICRO."""
    x, y = global_batch(step, world_size * K * MICRO)
    part = slice(rank * K * MICRO, (rank + 1) * K * MICRO)
    return list(zip(x[part].split(MICRO), y[part].split(MICRO)))


class SpyScaler(torch.amp.GradScaler):
    """A GradScaler that records the learner's calls in order (not the unscale_ that step()
    makes itself when the learner did not call it)."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.calls: list[str] = []
        self._in_step = False

    def scale(self, outputs: Any) -> Any:
        self.calls.append("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._in_step:
            self.calls.append("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("step")
        self._in_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._in_step = False

    def update(self, new_scale: Any = None) -> None:
        self.calls.append("update")
        return super().update(new_scale)


def _train_on_rank(fn: Callable, max_norm: float) -> dict[str, Any]:
    """fn(model, optimizer, scaler, micro_batches, max_norm) for STEPS steps; what it did."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = DDP(TinyLossModel())
    optimizer = RecordingSGD(model.parameters(), lr=0.1)
    scaler = SpyScaler()
    rec = Recorder()
    rec.watch_ddp(model, grads=False)  # one row per bucket all-reduce DDP makes
    dtypes: list[str] = []  # the dtype each forward's output was computed in
    model.module.net.register_forward_hook(lambda _m, _i, out: dtypes.append(str(out.dtype)))
    synced: list[bool] = []  # per forward: did DDP prepare its backward to all-reduce?
    model.register_forward_pre_hook(
        lambda module, _args: synced.append(module.require_backward_grad_sync))
    stale = _watch_stale_grads(model)
    steps = []
    for step in range(STEPS):
        before, calls, forwards = len(optimizer.seen), len(scaler.calls), len(dtypes)
        stale.clear()
        synced.clear()
        weights = state_snapshot(model.module)
        with rec.step(step):
            fn(model, optimizer, scaler, micro_batches(step, rank, world_size), max_norm)
        steps.append({"weights": weights, "grads": optimizer.seen[before:],
                      "calls": scaler.calls[calls:], "dtypes": dtypes[forwards:],
                      "stale": stale[:1] == [True],
                      "synced_at": [i for i, flag in enumerate(synced) if flag]})
    comms = rec.telemetry().comms
    for step, record in enumerate(steps):
        record["allreduces"] = int((comms["step"] == step).sum())
    return {"steps": steps}


def _watch_stale_grads(model: nn.Module) -> list[bool]:
    """A list that gets, at each gradient arriving for a parameter, whether that parameter's
    p.grad still held a non-zero gradient before it (the first entry of a step tells whether
    the step began from zeroed gradients). Under GradScaler a leftover unscaled gradient is
    1/scale of the next one, so the gradient test alone cannot see it."""
    stale: list[bool] = []
    for p in model.parameters():
        p.register_hook(lambda grad, p=p: stale.append(
            p.grad is not None and bool(p.grad.abs().max() > 0)))
    return stale


# -- the truth, computed in the kernel ----------------------------------------------------------

def reference_grad(weights: dict[str, torch.Tensor], step: int, world_size: int,
                   max_norm: float | None) -> torch.Tensor:
    """The fp32 gradient of the step's mean loss over the global batch at `weights`, clipped
    to max_norm (None: not clipped)."""
    model = TinyLossModel()
    model.load_state_dict(weights)
    x, y = global_batch(step, world_size * K * MICRO)
    model(x, y).backward()
    if max_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return flat_grad(list(model.parameters()))


def max_norm_for(world_size: int) -> float:
    """The clip threshold of a world size: CLIP times the true gradient norm at step 0."""
    start = state_snapshot(TinyLossModel())
    return CLIP[world_size] * float(reference_grad(start, 0, world_size, None).norm())


# -- the check ----------------------------------------------------------------------------------

KNOWN = [("No inf checks were recorded prior to update",
          "scaler.update() ran before any scaler.unscale_()/scaler.step() of this optimizer "
          "step: update() reads the inf checks that unscale_() records, so it comes once per "
          "optimizer step, after scaler.step(optimizer), not in the micro-batch loop."),
         ("unscale_() has already been called on this optimizer since the last update()",
          "scaler.unscale_() ran twice in one optimizer step: call it once, after the last "
          "micro-batch's backward and before clipping."),
         ("Expected to have finished reduction",
          "DDP found a backward it had prepared for but never saw: every forward outside "
          "no_sync() needs its backward before the next forward.")]


@check
def check_amp_step(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, optimizer, scaler, micro_batches, max_norm) must make one optimizer step of
    fp16 AMP with accumulation: non-zero gradients equal to the fp32 gradient (clipped) within
    TOLERANCE, the scaler calls in order, one all-reduce."""
    for n, results in at_world_sizes(_train_on_rank, fn, WORLD_SIZES,
                                     lambda n: (max_norm_for(n),), timeout, known=KNOWN):
        _judge(results, n, max_norm_for(n))
    return (f"{STEPS} optimizer steps of {K} micro-batches on {listing(WORLD_SIZES)} ranks: "
            f"scaler calls in order ({ORDER}), one all-reduce per step, and non-zero "
            f"gradients within {TOLERANCE:g} (relative) of the fp32 gradient, clipped.")


def _judge(results: list[dict[str, Any]], n: int, max_norm: float) -> None:
    where = f"on {n} ranks, "
    for result in results:
        for record in result["steps"]:
            _judge_step_calls(record, where)
    _judge_last_synced([result["steps"][0] for result in results], where)
    for rank, result in enumerate(results):
        for step, record in enumerate(result["steps"]):
            want = reference_grad(record["weights"], step, n, max_norm)
            here = where + f"rank {rank}, step {step}: "
            if record["stale"]:
                raise Rejected(f"{here}p.grad still held the previous step's gradient when "
                               "this step's first backward ran, so the new one was added to "
                               "it: call optimizer.zero_grad() once per optimizer step (after "
                               "scaler.update(), or at the start of the step).")
            _judge_gradient(record["grads"][0], want, here, max_norm, n)


def _judge_step_calls(record: dict[str, Any], where: str) -> None:
    """One optimizer step's calls: the scaler's order, fp16 forwards, one optimizer step and
    one all-reduce."""
    _judge_calls(record["calls"], where)
    _judge_autocast(record["dtypes"], where)
    stepped = len(record["grads"])
    if stepped != 1:
        raise Rejected(f"{where}the optimizer stepped {stepped} times in one call: "
                       "call scaler.step(optimizer) once, after the last micro-batch.")
    if record["allreduces"] != 1:
        raise Rejected(f"{where}DDP made {record['allreduces']} all-reduces in one "
                       f"optimizer step of {K} micro-batches: run the first {K - 1} "
                       "(forward and backward) inside model.no_sync() (lesson 07).")


def _judge_last_synced(first: list[dict[str, Any]], where: str) -> None:
    """The ranks must step with the same gradient; when they do not and the one synced
    forward was not the last micro-batch's, name it (the all-reduce count was right)."""
    grads = [record["grads"][0] for record in first]
    apart = [rank for rank in range(1, len(grads))  # relative: these gradients are ~1e-7
             if float((grads[rank] - grads[0]).norm()) > 1e-4 * float(grads[0].norm())]
    hint = apart and collectives.early_sync(where, apart[0], first[0]["synced_at"], K,
                                            "at step 0")
    if hint:
        raise Rejected(hint)


def _judge_autocast(dtypes: list[str], where: str) -> None:
    """Every forward of the step must have computed in fp16 (torch.autocast ran)."""
    if len(set(dtypes)) != 1 or dtypes[0] != "torch.float16":
        seen = listing(sorted(set(dtypes))) if dtypes else "no forward at all"
        hint = ("torch.autocast('cpu') without a dtype computes in bfloat16, CPU autocast's "
                "default; pass dtype=torch.float16" if "torch.bfloat16" in dtypes else
                "run each micro-batch's forward under torch.autocast('cpu', "
                "dtype=torch.float16)")
        raise Rejected(f"{where}the model's forwards computed in {seen}, not only "
                       f"torch.float16: {hint}. (fp32 gradients pass the gradient test; "
                       "the exercise is fp16 AMP.)")


def _judge_calls(calls: list[str], where: str) -> None:
    """The learner's scaler calls in one optimizer step, against ORDER."""
    scales = calls.count("scale")
    if scales == 0:
        raise Rejected(f"{where}scaler.scale() was never called: in fp16 the small gradients "
                       "underflow to 0 without loss scaling. Call "
                       "scaler.scale(loss).backward() for every micro-batch.")
    if scales != K:
        raise Rejected(f"{where}scaler.scale() ran {scales} times for {K} micro-batches: call "
                       "scaler.scale(loss).backward() once per micro-batch (a backward of the "
                       "summed loss keeps every micro-batch's graph in memory at once).")
    rest = [c for c in calls if c != "scale"]
    if rest.count("step") != 1 or rest.count("update") != 1:
        raise Rejected(f"{where}your scaler calls after the micro-batches were {rest}: one "
                       "scaler.step(optimizer) and one scaler.update() per optimizer step.")
    if "unscale_" not in rest:
        raise Rejected(f"{where}scaler.unscale_(optimizer) was never called, so the clip saw "
                       "the scaled gradients (x65536): call unscale_ before "
                       "clip_grad_norm_.")
    if calls != ["scale"] * K + ["unscale_", "step", "update"]:
        raise Rejected(f"{where}your scaler calls were {calls}; the order is {ORDER}.")


def _judge_gradient(got: torch.Tensor, want: torch.Tensor, where: str, max_norm: float,
                    n: int) -> None:
    nonzero, wanted = float((got != 0).double().mean()), float((want != 0).double().mean())
    if nonzero < 0.5 * wanted:
        raise Rejected(f"{where}{100 * nonzero:.0f}% of the gradients the optimizer stepped "
                       f"with were non-zero (fp32: {100 * wanted:.0f}%): they underflowed in "
                       "fp16. Scale the loss: scaler.scale(loss).backward().")
    error = float((got - want).norm() / want.norm())
    if error <= TOLERANCE:
        return
    ratio = float(got.norm() / want.norm())
    if ratio < 1e-3:
        raise Rejected(f"{where}the gradient the optimizer stepped with is {ratio:.1e} times "
                       "the true (clipped) one: the clip saw the scaled gradients. Call "
                       "scaler.unscale_(optimizer) before clip_grad_norm_.")
    if float(got.norm()) > max_norm * (1 + 1e-3):
        raise Rejected(f"{where}the gradient's norm {float(got.norm()):.3g} is above "
                       f"max_norm = {max_norm:.3g}: clip with "
                       "nn.utils.clip_grad_norm_(model.parameters(), max_norm) after "
                       "unscale_.")
    if n != K and abs(ratio - 1 / n) < 0.05 / n:
        raise Rejected(f"{where}the gradient is {ratio:.2f} times the true one, 1/{n} on {n} "
                       "ranks: DDP already averages the gradients over the ranks; divide "
                       f"each micro-batch's loss by k = {K} only, not by the world size.")
    for factor in (K, 1 / K):
        if abs(ratio - factor) < 0.05 * factor:
            raise Rejected(f"{where}the gradient is {ratio:.2f} times the true one: divide "
                           f"each micro-batch's loss by k = {K} (and nothing else: DDP "
                           "averages over the ranks).")
    raise Rejected(f"{where}the gradient differs from the fp32 gradient by {error:.1e} "
                   f"(relative; fp16 rounding stays below {TOLERANCE:g}), norm ratio "
                   f"{ratio:.3g}, which none of the usual slips gives (a factor of k or of "
                   "the world size, the scale left in, a missing clip, the wrong micro-batch "
                   "synced). Compare your step with the lesson's amp_step call by call.")
