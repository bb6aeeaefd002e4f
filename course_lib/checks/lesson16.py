"""`check_parallelize` for lesson 16: the learner's `parallelize(model, mesh)` applies tensor
parallelism to a small language model (an embedding, two MLP blocks, a head). The check runs
it at 2 and 4 ranks, takes one training step with the loss inside `loss_parallel()`, and
compares the loss and every gradient with the same step in one process. It also wants what
tensor parallelism is for: one collective per block in the forward (column-then-row), every
block and the head sharded, the logits left sharded over the vocabulary. Its hints say which
layer did what: a plan key that matched nothing, a swapped style, gathered or local logits,
a gather after every layer, a block or the head left whole."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, same
from course_lib.teach import tensor_parallel as tp
from course_lib.words import listing

WORLD_SIZES = (2, 4)
DIM, HIDDEN, VOCAB, BATCH, SEED = 16, 64, 64, 32, 0
BLOCKS = 2

REPLICATED_LOGITS = (
    "the logits reached the loss whole on every rank (a Replicate DTensor): loss_parallel "
    "needs them sharded over the vocabulary. Drop output_layouts=Replicate() from the "
    "head's ColwiseParallel and keep use_local_output=False.")

# PyTorch's own messages (torch 2.13, and 2.11's where it words one otherwise), each with
# what it means for a plan.
KNOWN = [
    ("a and b must have same reduction dim",
     "a layer got an input whose features do not match its plan (DTensor's sharding "
     "propagation refused a matrix multiply). ColwiseParallel splits the weight's rows, the "
     "output features: use it on each block's `up`; RowwiseParallel splits the input "
     "features: use it on each `down`, which receives `up`'s slice."),
    ("mat1 and mat2 shapes cannot be multiplied",
     "a layer outside the plan received the slice of features that a column-parallel layer "
     "handed it (ColwiseParallel returns this rank's output slice): the layer after a "
     "ColwiseParallel one must be RowwiseParallel."),
    ("out of bounds",
     "the loss got a plain tensor with only this rank's slice of the vocabulary (the "
     "head's ColwiseParallel hands back its local slice by default), so a target outside "
     "the slice is out of bounds. Keep the logits a DTensor for loss_parallel: "
     "ColwiseParallel(use_local_output=False) on the head."),
    ("requires exactly one mesh dim to shard", REPLICATED_LOGITS),
    ("loss_parallel() should be enabled only when the input tensor is sharded",  # torch 2.11
     REPLICATED_LOGITS),
    ("got mixed torch.Tensor and DTensor",
     "a DTensor met a plain tensor inside the model: a block's layer returned a DTensor "
     "(use_local_output=False) that the residual `x + ...` adds to a plain tensor. Keep "
     "the default use_local_output=True inside the blocks; only the head needs False."),
]


class Block(nn.Module):
    """A transformer's MLP block: up-projection, activation, down-projection, residual."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.relu(self.up(x)))


class TinyLM(nn.Module):
    """Token -> embedding -> blocks -> logits over the vocabulary."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*[Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def make_model() -> TinyLM:
    """The model every process builds: the same weights everywhere (seeded privately)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return TinyLM()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, next tokens): the same batch on every rank, as tensor parallelism needs."""
    g = torch.Generator().manual_seed(SEED + 1)
    tokens = torch.randint(0, VOCAB, (BATCH + 1,), generator=g)
    return tokens[:-1], tokens[1:]


def one_process() -> dict[str, Any]:
    """The true step: loss and gradients of the whole model in one process."""
    model = make_model()
    tokens, targets = batch()
    loss = F.cross_entropy(model(tokens), targets)
    loss.backward()
    return {"loss": loss.item(), "grads": {n: p.grad.detach().clone()
                                           for n, p in model.named_parameters()
                                           if p.grad is not None}}


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu()


def _step_on_rank(fn: Callable) -> dict[str, Any]:
    """On a rank: fn(model, mesh), then one step with the loss in loss_parallel(); what the
    step computed, how each parameter and the logits are laid out, the collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    given = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = fn(given, mesh)
    model = returned if isinstance(returned, nn.Module) else given
    skipped = [m.group(1) for w in caught
               if (m := re.search(r"plan key '([^']*)' could not be resolved", str(w.message)))]
    if skipped:  # judged first: a layer left out of the plan explains what follows
        return {"skipped": skipped}
    tokens, targets = batch()
    with tp.counted(model) as seen:
        logits = model(tokens)
        with loss_parallel():
            loss = F.cross_entropy(logits, targets)
            loss.backward()
    params = dict(model.named_parameters())
    return {"loss": _full(loss).item(), "skipped": skipped,
            "grads": {n: _full(p.grad) for n, p in params.items() if p.grad is not None},
            "layout": {n: str(getattr(p, "placements", "plain")) for n, p in params.items()},
            "logits": {"placements": str(getattr(logits, "placements", "plain tensor")),
                       "bytes": tp.local_bytes(logits)},
            "per_layer": seen.layers()}


@check
def check_parallelize(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, mesh) applies tensor parallelism to `model` (a TinyLM: embed, blocks[i].up
    and .down, head) over the 1-D `mesh` and returns it. The check takes one step at 2 and 4
    ranks with the loss in loss_parallel(): loss and gradients as in one process, one
    collective per block in the forward, the blocks and the head sharded, sharded logits."""
    truth = one_process()
    passed: list[int] = []
    runs = at_world_sizes(_step_on_rank, fn, WORLD_SIZES, timeout=timeout, known=KNOWN)
    for n in WORLD_SIZES:
        try:
            _, results = next(runs)
        except Rejected as failed:  # a crash or a hang at this size
            raise Rejected(_where(n, passed) + str(failed), failed.failure,
                           kind=failed.kind) from None
        hint = _hint(results, truth, n)
        if hint:
            raise Rejected(_where(n, passed) + hint)
        passed.append(n)
    return (f"on {listing(WORLD_SIZES)} ranks the loss and every gradient equal one process's; "
            f"each block cost one collective in the forward, every block and the head are "
            f"sharded, and each rank held 1/N of the logits.")


def _where(n: int, passed: list[int]) -> str:
    if passed:
        return (f"right on {listing(passed)} ranks, wrong on {n}: something in your code "
                "assumes the number of ranks; use the mesh you are given. ")
    return f"on {n} ranks, "


def _hint(results: list[dict[str, Any]], truth: dict[str, Any], n: int) -> str | None:
    """None when the step is right and sharded as it should be, else what this answer did."""
    rank0 = results[0]
    if rank0["skipped"]:
        keys = listing([f"'{key}'" for key in rank0["skipped"]])
        return (f"parallelize_module skipped the plan key {keys}: it names no submodule, "
                "and torch only warns (\"could not be resolved ... skipping this plan entry\"). "
                "The model's names are embed, blocks.0.up, blocks.0.down, blocks.1.up, "
                "blocks.1.down and head.")
    for rank, result in enumerate(results):
        wrong = _numbers_hint(rank, result, truth)
        if wrong:
            return wrong
    return _layout_hint(rank0, n)


def _numbers_hint(rank: int, result: dict[str, Any], truth: dict[str, Any]) -> str | None:
    loss_ok = abs(result["loss"] - truth["loss"]) <= 1e-4 * abs(truth["loss"]) + 1e-6
    off = [name for name, g in truth["grads"].items()
           if not same(result["grads"].get(name), g)]
    if loss_ok and not off:
        return None
    said = (f"rank {rank}'s loss {result['loss']:.5f} is not one process's {truth['loss']:.5f}"
            if not loss_ok else f"the loss is right, but rank {rank}'s gradients of "
            f"{listing(off[:4])}{' and more' if len(off) > 4 else ''} differ from one process's")
    return (f"{said}. Tensor parallelism must not change the numbers: every rank starts from "
            "the same weights and the same batch here, so the plan computes something else "
            "(a layer split the wrong way, or a sharded output used as if it were whole).")


def _layout_hint(result: dict[str, Any], n: int) -> str | None:
    layout = result["layout"]
    whole = [name for name, placement in layout.items()
             if name.startswith(("blocks.", "head.")) and name.endswith("weight")
             and "Shard" not in placement]
    if whole:
        return (f"{listing(whole)} {'is' if len(whole) == 1 else 'are'} whole on every rank "
                "(not sharded): each rank holds and computes all of it. Shard every block's "
                "up and down, and the head (ColwiseParallel(use_local_output=False), so that "
                "the logits stay sharded for loss_parallel).")
    blocks = {layer: passes.get("forward", {}) for layer, passes in result["per_layer"].items()
              if layer.startswith("blocks.") and passes.get("forward")}
    issued = sum(sum(ops.values()) for ops in blocks.values())
    if issued > BLOCKS:
        said = "; ".join(f"{layer}: {', '.join(f'{k} {op}' for op, k in ops.items())}"
                         for layer, ops in blocks.items())
        return (f"the numbers are right, but the blocks' forward issued {issued} collectives, "
                f"{issued / BLOCKS:g} per block ({said}). Pair each block's layers: "
                "ColwiseParallel on up hands its slice straight to RowwiseParallel on down, one "
                "all-reduce per block; an output gathered after every layer costs an all_gather "
                "each.")
    full = BATCH * VOCAB * 4
    if result["logits"]["bytes"] * n > full:
        return (f"each rank held {result['logits']['bytes']:,} bytes of logits "
                f"({result['logits']['placements']}), not 1/{n} of the {full:,}: keep them "
                "sharded over the vocabulary (Shard(-1)) up to the loss.")
    return None
