"""Check for lesson 13's exercise: wrap a model (DDP, ZeRO-1, FSDP2, with the learner's
choice of units) so that each rank's training memory fits a budget. The check trains it on
real ranks, counts each rank's tensors with lesson 13's meter, and compares the weights with
one-process Adam on the whole batch."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, differing
from course_lib.teach.memory import Meter, MiB, model_states

SEED = 13
LAYERS, WIDTH = 8, 256
BATCH, STEPS = 24, 3
WORLD_SIZES = (2, 3)
# A learning rate per world size: an answer that ignores its `lr` and types one in cannot match
# both (the exercise notebook shows lr = 1e-3, the first one).
LRS = {2: 1e-3, 3: 3e-3}
LR = LRS[2]
N_PARAMS = LAYERS * (WIDTH * WIDTH + WIDTH)
LAYER_BYTES = 4 * (WIDTH * WIDTH + WIDTH)
PARAM_TENSORS = 2 * LAYERS  # a weight and a bias per layer
# Adam's weights after 3 steps: the ranks add the gradient in another order than one process,
# and Adam divides by sqrt(v), so a tiny gradient's rounding moves its update more than in SGD.
# Measured (DDP, ZeRO-1, FSDP2 and FSDP2 with offload alike): largest gap 2.3e-7 at 2 ranks,
# 3.5e-6 at 3, 4.2e-7 at 4. 1e-4 leaves a 29x margin; SGD instead of Adam is off by 3.0e-3,
# a learning rate 10% off by 2.9e-3, and a step that never happened by more.
ATOL = 1e-4


def budget(world_size: int) -> float:
    """Bytes one rank may hold for parameters, gradients, Adam's state and gathered
    parameters: a 1/N share of the 16 bytes per parameter, plus two layers held in full,
    plus Adam's `step` counters (one 4-byte tensor per parameter tensor, on every rank).
    Shares as fully_shard makes them: dim 0 split in ceil(rows / N) rows, the first ranks
    the largest, and the all-gather buffer padded to N equal shards."""
    rows = -(-WIDTH // world_size)  # ceil: the largest shard of a weight's or bias's dim 0
    largest_share = LAYERS * rows * (WIDTH + 1)
    gathered_layer = 4 * rows * world_size * (WIDTH + 1)
    return 16 * largest_share + 2 * gathered_layer + 4 * PARAM_TENSORS


def make_model() -> nn.Sequential:
    """The exercise's model: LAYERS blocks of Linear(WIDTH, WIDTH) + Tanh, the same weights
    on every rank and in the kernel (a private seed: the kernel's random state stays put)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                               for _ in range(LAYERS)])


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of one step (the ranks take equal shares)."""
    x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(SEED * 100 + step))
    return x, x.roll(1, dims=1)


def _full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The wrapped model's full weights by plain names (gathers FSDP2's shards: a collective)."""
    weights = {}
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        weights[name.removeprefix("module.")] = full.detach().clone()
    return weights


@contextlib.contextmanager
def _cpu_default_mesh() -> Iterator[None]:
    """Make fully_shard's default mesh (mesh=None) the CPU one while the learner wraps.

    The check's ranks are CPU ranks (gloo). FSDP2's default mesh follows the accelerator,
    not the process group (_fsdp_init.py, _init_default_mesh: torch._C._get_accelerator()),
    so on a GPU machine rank 1 of a 1-GPU box asks for cuda:1 ("invalid device ordinal").
    """
    module = importlib.import_module("torch.distributed.fsdp._fully_shard._fully_shard")
    default = module._init_default_mesh

    def cpu_mesh(mesh_dim_names: tuple[str, ...] | None = None):
        return init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=mesh_dim_names)

    module._init_default_mesh = cpu_mesh
    try:
        yield
    finally:
        module._init_default_mesh = default


def _optimizer_settings(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The class (inside ZeroRedundancyOptimizer), learning rates and weight decays."""
    inner = getattr(optimizer, "optim", optimizer)
    groups = inner.param_groups
    return {"class": type(inner).__name__, "lrs": sorted({g.get("lr") for g in groups}),
            "weight_decay": max(float(g.get("weight_decay", 0.0)) for g in groups)}


def _train_on_rank(fn: Callable, lr: float) -> dict[str, Any]:
    """fn(model, lr) -> (model, optimizer); STEPS of Adam training on this rank's share,
    with every rank's tensors counted."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    meter = Meter()
    with _cpu_default_mesh():
        answer = fn(make_model(), lr)
    if not (isinstance(answer, tuple) and len(answer) == 2
            and isinstance(answer[1], torch.optim.Optimizer)):
        raise TypeError(f"{fn.__name__}() must return (model, optimizer), got {answer!r:.80}")
    model, optimizer = answer
    model_ids = {id(p) for p in model.parameters()}
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    computed = _ComputeDtypes(model)  # filled by the first forward
    peak, first_gathered = 0.0, 0
    for step in range(STEPS):
        x, y = (t.chunk(world_size)[rank] for t in global_batch(step))
        with meter.forward(model):
            loss = F.mse_loss(model(x), y)
        computed.stop()
        loss.backward()
        optimizer.step()
        counts = meter.measure(model, optimizer)
        optimizer.zero_grad()
        peak = max(peak, model_states(counts))
        first_gathered = meter.trace[0][1] if meter.trace else 0
    return {"counts": counts, "peak": peak, "first_gathered": first_gathered,
            "optimizer_on_model": bool(model_ids & stepped), "weights": _full_weights(model),
            "root_sharded": isinstance(model, FSDPModule),
            "blocks_sharded": any(isinstance(m, FSDPModule) for m in model.modules()),
            "optimizer": _optimizer_settings(optimizer), "computed in": computed.dtypes}


class _ComputeDtypes:
    """The dtypes of the weights each layer computes with in a forward (FSDP2's
    MixedPrecisionPolicy gathers them as its param_dtype), recorded by forward pre-hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.dtypes: set[str] = set()
        self._hooks = [m.register_forward_pre_hook(self._note) for m in model.modules()
                       if next(m.parameters(recurse=False), None) is not None]

    def _note(self, module: nn.Module, _args: Any) -> None:
        self.dtypes.update(str(p.dtype) for p in module.parameters(recurse=False))

    def stop(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


@cache
def reference_weights(lr: float = LR) -> dict[str, torch.Tensor]:
    """One process, the whole batch, Adam(lr=lr): the weights after STEPS steps."""
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(STEPS):
        F.mse_loss(model(global_batch(step)[0]), global_batch(step)[1]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _mib(value: float) -> str:
    return f"{value / MiB:.2f} MiB"


def _judge_optimizer(name: str, n: int, lr: float, settings: dict[str, Any]) -> None:
    """The optimizer's learning rate and weight decay, named as this answer set them."""
    if settings["lrs"] != [lr]:
        raise Rejected(
            f"on {n} ranks {name}() was given lr={lr:g}, but the optimizer it returned uses "
            f"lr={', '.join(f'{v:g}' for v in settings['lrs'])}: build the optimizer with the "
            "lr argument, not a typed-in value")
    if settings["weight_decay"]:
        raise Rejected(
            f"the optimizer is {settings['class']} with weight_decay="
            f"{settings['weight_decay']:g}; the exercise asks for Adam, which has none "
            "(AdamW's default is 0.01): use torch.optim.Adam")


def _judge_weights(name: str, n: int, lr: float, result: dict[str, Any]) -> None:
    """Rank 0's trained weights against one-process Adam; a hint naming what went wrong."""
    _judge_optimizer(name, n, lr, result["optimizer"])
    if not result["optimizer_on_model"]:
        raise Rejected(
            f"on {n} ranks the optimizer you returned does not hold the parameters of the model "
            "you returned, so it never stepped them: fully_shard replaces the model's "
            "parameters by sharded DTensors; build the optimizer after wrapping, from "
            "model.parameters()")
    want = reference_weights(lr)
    wrong = differing(result["weights"], want, rtol=0.0, atol=ATOL)
    if wrong:
        gap = max(float((result["weights"][k] - want[k]).abs().max()) for k in wrong
                  if k in result["weights"])
        low = sorted(result["computed in"] - {"torch.float32"})
        if low:
            raise Rejected(
                f"on {n} ranks the layers computed with {', '.join(low)} weights "
                "(MixedPrecisionPolicy(param_dtype=...) gathers them in that dtype), and after "
                f"{STEPS} steps the weights differ from fp32 one-process Adam by up to {gap:.1e}: "
                "low-precision compute changes the training, and the exercise asks for the "
                "weights of one-process Adam. Leave mp_policy out: sharding alone saves the "
                "memory")
        raise Rejected(
            f"on {n} ranks, after {STEPS} steps the weights differ from one-process "
            f"torch.optim.Adam(lr={lr:g}) on the whole batch ({len(wrong)} tensors, largest gap "
            f"{gap:.1e}, e.g. {wrong[0]}): sharding must not change the training; use Adam with "
            f"the lr {name}() is given, over the wrapped model's parameters")


def _judge_memory(n: int, ranks: list[dict[str, Any]]) -> None:
    """The largest rank's model states against the budget; a hint naming what was held."""
    worst = max(range(n), key=lambda r: ranks[r]["peak"])
    result, limit = ranks[worst], budget(n)
    if result["peak"] <= limit:
        return
    c = result["counts"]
    full = 4 * N_PARAMS
    held = (f"rank {worst} of {n} held {_mib(result['peak'])} (parameters "
            f"{_mib(c['parameters'])}, gradients {_mib(c['gradients'])}, optimizer state "
            f"{_mib(c['optimizer state'])}, gathered parameters "
            f"{_mib(c['gathered parameters'])}); the budget is {_mib(limit)}")
    if c["parameters"] >= 0.99 * full and c["optimizer state"] >= 0.99 * 2 * full:
        raise Rejected(f"{held}. Every rank kept the whole model, its gradients and Adam's "
                       "state (16 bytes per parameter, as DDP does): shard them with FSDP2's "
                       "fully_shard")
    if c["parameters"] >= 0.99 * full:
        raise Rejected(f"{held}. Adam's state was sharded (ZeRO-1), but every rank still held "
                       "all the parameters and gradients: shard those too, with fully_shard")
    if c["gathered parameters"] >= 0.99 * full and result["first_gathered"] >= 0.99 * full:
        raise Rejected(f"{held}. The parameters were sharded, but FSDP gathered the whole model "
                       "at once, from the first layer's forward: the whole model is one unit. "
                       "Call fully_shard on each layer, then on the root")
    if c["gathered parameters"] >= 0.99 * full and not result["root_sharded"]:
        raise Rejected(f"{held}. Your blocks are FSDP units but the model itself is not: "
                       "fully_shard was never called on the root, so every block is a root, "
                       "and a root's reshard_after_forward defaults to False (kept gathered "
                       "from its forward to its backward). Call fully_shard(model) after the "
                       "blocks")
    if c["gathered parameters"] >= 0.99 * full:
        raise Rejected(f"{held}. Each layer stayed gathered after its forward, until the whole "
                       "model was held in full: that is reshard_after_forward=False; leave it "
                       "True so each layer is freed after its forward")
    raise Rejected(f"{held}: shard more of it, or gather smaller units")


@check
def check_shard_to_fit(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """Train fn's wrapping at 2 and 3 ranks (lr 1e-3, then 3e-3): the weights must match
    one-process Adam at that lr and every
    rank's parameters, gradients, optimizer state and gathered parameters must fit budget(N)."""
    seen = []
    for n, ranks in at_world_sizes(_train_on_rank, fn, WORLD_SIZES,
                                   args=lambda n: (LRS[n],), timeout=timeout):
        _judge_weights(fn.__name__, n, LRS[n], ranks[0])
        _judge_memory(n, ranks)
        peak = max(r["peak"] for r in ranks)
        seen.append(f"{n} ranks: {_mib(peak)} of {_mib(budget(n))}")
    return ("fits, with the same weights as one-process Adam; largest rank: "
            + "; ".join(seen))
