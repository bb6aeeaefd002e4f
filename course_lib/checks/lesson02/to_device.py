"""`check_to_device` for lesson 02's second exercise: a training step puts everything it
uses on the rank's device. The meta device stands in for the GPU, as in the lesson; what the
returned objects compute on the CPU is compared with what the given ones compute, so that a
new object in place of a moved one is caught.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    WORLD_SIZES,
    Rejected,
    at_world_sizes,
    check,
    close,
    same,
)
from course_lib.teach import placement
from course_lib.words import listing

DEVICE = "meta"  # the stand-in for cuda:LOCAL_RANK in the placement check


def step_parts() -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]:
    """A model with a buffer (BatchNorm), a weighted loss and a batch, all on the CPU."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 4.0]))
    return model, loss_fn, torch.randn(16, 6), torch.randint(0, 3, (16,))


def _placement_on_rank(fn: Callable, device: str) -> dict:
    """Where fn put everything on `device`, whether a step runs there, and what the returned
    objects compute on the CPU next to what the given ones compute."""
    out = fn(*step_parts(), device)
    if not _four(out):
        return {"returned": repr(out)[:80]}
    model, loss_fn, x, y = out
    snap = placement.snapshot(model, device=device, inputs=x, targets=y, loss_fn=loss_fn)
    try:
        loss_fn(model(x), y).backward()
        error = ""
    except RuntimeError as exc:
        error = str(exc).splitlines()[0]
    return {"snapshot": snap, "error": error, "values": _values_on_cpu(fn)}


def _four(out: Any) -> bool:
    return isinstance(out, (tuple, list)) and len(out) == 4


def _values_on_cpu(fn: Callable) -> dict:
    """With device="cpu" every .to() is a no-op, so the returned objects must compute exactly
    what the given ones do: a new model, loss or batch in their place shows up here."""
    model, loss_fn, x, y = step_parts()
    with torch.no_grad():
        want = {"outputs": model(x), "loss": loss_fn(model(x), y), "x": x.clone(), "y": y.clone()}
    out = fn(*step_parts(), "cpu")
    if not _four(out):
        return {"returned": repr(out)[:80]}
    got_model, got_loss_fn, got_x, got_y = out
    with torch.no_grad():
        got = {"outputs": got_model(x), "loss": got_loss_fn(want["outputs"], y)}
    return {"want_loss": float(want["loss"]), "got_loss": float(got["loss"]),
            "loss_has_weight": getattr(got_loss_fn, "weight", None) is not None,
            "same_model": same(got["outputs"], want["outputs"]),
            "same_x": same(got_x, want["x"]), "same_y": same(got_y, want["y"])}


@check
def check_to_device(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, loss_fn, x, y, device) must return (model, loss_fn, x, y), the objects it
    was given, with everything on `device` (meta stands in for a GPU); then one training
    step must run there. Run on 2 and on 3 ranks."""
    for _, results in at_world_sizes(_placement_on_rank, fn, WORLD_SIZES, (DEVICE,),
                                     timeout, known=META_ERRORS):
        _judge_placement(results)
    return (f"on {listing(WORLD_SIZES)} ranks the model's parameters and buffers, the "
            f"loss's weight, the inputs and the targets are on {DEVICE}, a training step "
            "runs there, and they are the objects to_device() was given.")


# PyTorch's errors for reading a meta tensor's values (.tolist(), x[x > 0], torch.unique(x),
# .item()): most are NotImplementedError, which must not read as "not written yet".
META_READ = ("to_device() read values out of a tensor on the meta device, which has shapes but "
             "no data (this check moves things to meta in place of a GPU, as the lesson does). "
             "On a GPU such a read (.tolist(), .item(), x[mask]) copies to the CPU and waits for "
             "the GPU; to_device() only moves things: leave the read out.")
META_ERRORS = tuple((fragment, META_READ) for fragment in
                    ("meta tensor", "Meta tensors", "register_meta"))

HINTS = {
    "inputs": "a tensor's .to() returns a copy and leaves the original where it was: "
              "x = x.to(device)",
    "targets": "the targets must be on the device too, and a tensor's .to() returns a copy: "
               "y = y.to(device)",
    "loss_fn buffers": "the loss's class weight is a buffer created on the CPU: move the loss "
                       "with loss_fn.to(device)",
    "model parameters": "move the whole model with model.to(device) (a module moves in place)",
    "model buffers": "the model's buffers (BatchNorm's running statistics) stayed behind: "
                     "model.to(device) moves parameters and buffers",
}


def _judge_placement(results: list[dict]) -> None:
    n = len(results)
    for rank, got in enumerate(results):
        if "returned" in got:
            raise Rejected(f"rank {rank}: to_device() returned {got['returned']}; return the "
                           "four things it was given, moved: (model, loss_fn, x, y).")
    diagnosis = placement.diagnose([got["snapshot"] for got in results])
    if diagnosis.misplaced or diagnosis.split:
        rank, item, where = (diagnosis.split or diagnosis.misplaced)[0]
        hint = HINTS.get(item, f"move {item} with .to(device)")
        raise Rejected(f"with {n} ranks, rank {rank}: {item} on {where}, not on {DEVICE}: "
                       f"{hint}.")
    for rank, got in enumerate(results):
        if got["error"]:
            raise Rejected(f"with {n} ranks, everything is on {DEVICE}, but rank {rank}'s "
                           f"training step failed: {got['error']}")
    _judge_values(results[0]["values"])


def _judge_values(values: dict) -> None:
    """The objects returned must be the ones given (moved), not new ones."""
    if "returned" in values:
        raise Rejected(f"with device='cpu', to_device() returned {values['returned']}; return "
                       "(model, loss_fn, x, y).")
    if not values["same_model"]:
        raise Rejected("the model to_device() returned is not the one it was given: its "
                       "outputs differ (a new model has new weights). Move the given model: "
                       "model.to(device).")
    if not close(values["got_loss"], values["want_loss"]):
        missing = ("; it has no class weight: a new nn.CrossEntropyLoss() in place of the "
                   "weighted one" if not values["loss_has_weight"] else "")
        raise Rejected(f"the loss function to_device() returned is not the one it was given: "
                       f"on the same outputs it gives {values['got_loss']:.4f} instead of "
                       f"{values['want_loss']:.4f}{missing}. Move the given loss, "
                       "loss_fn.to(device), which moves its weight.")
    for name in ("x", "y"):
        if not values[f"same_{name}"]:
            raise Rejected(f"the {name} to_device() returned holds other values than the {name} "
                           f"it was given: return {name}.to(device), the given batch moved.")
