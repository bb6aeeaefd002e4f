"""Lesson 11's training job: the given loop (load, train, save every EVERY steps, die at
the planned step) in which the learner's Checkpointer runs, and the true results that the
check compares with: an uninterrupted run, and resumes that each leave one piece out."""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.checks.common import state_snapshot
from course_lib.teach.faults import SaveSpy

TOTAL, EVERY = 14, 3  # steps in all; a checkpoint every EVERY steps
SLOW_SAVE_S = 0.5  # rank 0's first torch.save waits this long: a rank that does not wait sees it
SAMPLES, BATCH = 36, 3  # 6 batches a epoch at 2 ranks, 4 at 3: the kill falls mid-epoch
# The pieces a reference resume leaves out, to name what an answer's resume missed.
MISSING = {
    "optimizer": "the optimizer's state (SGD's momentum buffers) was not restored: save and "
                 "load optimizer.state_dict()",
    "scheduler": "the learning-rate scheduler restarted from its first step: save and load "
                 "scheduler.state_dict()",
    "rank0_rng": "every rank got rank 0's random state back, so the other ranks' dropout "
                 "masks changed: save each rank's torch.get_rng_state() (all_gather_object to "
                 "rank 0, or one file per rank) and give each rank its own",
    "rng": "the random state was not restored, so dropout drew other masks after the "
           "resume: save torch.get_rng_state() of every rank and set it back on load",
    "model": "the model's weights were not restored: load the saved state_dict into "
             "ddp_model.module",
}


# -- the job: a given loop, the learner's Checkpointer ---------------------------------------

def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(SAMPLES, 6, generator=g), torch.randint(0, 3, (SAMPLES,), generator=g)


def _build() -> tuple[nn.Module, nn.Module, Any, Any]:
    """Model (with dropout), DDP, SGD with momentum and a StepLR, each rank seeded apart."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    ddp_model = DDP(model)
    torch.manual_seed(1000 + dist.get_rank())  # each rank its own dropout masks
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    return model, ddp_model, optimizer, scheduler


def _train_step(step: int, ddp_model: nn.Module, optimizer: Any, scheduler: Any,
                sampler: DistributedSampler, x: torch.Tensor, y: torch.Tensor) -> None:
    """Step `step` (0-based): its batch follows from the step (epoch and position)."""
    per_epoch = len(sampler) // BATCH
    epoch, position = divmod(step, per_epoch)
    sampler.set_epoch(epoch)
    rows = list(sampler)[position * BATCH:(position + 1) * BATCH]
    F.cross_entropy(ddp_model(x[rows]), y[rows]).backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def job(checkpointer_class: Callable, folder: str, kill_at: int | None = None,
        in_save: bool = False, probes: str | None = None) -> dict[str, Any]:
    """The given loop: load, train to TOTAL saving every EVERY steps, die after step
    `kill_at` (`in_save`: half-way through that step's save). With `probes`, right after the
    first save every rank loads it into fresh objects and writes what it found there, and a
    rank killed in a save writes which of its writes was cut."""
    model, ddp_model, optimizer, scheduler = _build()
    x, y = _data()
    sampler = DistributedSampler(range(SAMPLES), seed=0)
    checkpointer = checkpointer_class(folder)
    resumed_at = checkpointer.load(ddp_model, optimizer, scheduler)
    step = resumed_at
    with SaveSpy() as spy:
        while step < TOTAL:
            _train_step(step, ddp_model, optimizer, scheduler, sampler, x, y)
            step += 1
            if step % EVERY == 0:
                _save(checkpointer_class, checkpointer, spy, step, (ddp_model, optimizer,
                      scheduler), folder, probes, in_save and step == kill_at)
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # the job dies here, on every rank
    return {"resumed_at": resumed_at, "weights": state_snapshot(model)}


def _save(checkpointer_class: Callable, checkpointer: Any, spy: SaveSpy, step: int,
          objects: tuple, folder: str, probes: str | None, kill: bool) -> None:
    """checkpointer.save; cut half-way (`kill`: the spy's crash), or, the first time,
    probed: a load right after it returned, with rank 0's write made slow."""
    rank = dist.get_rank()
    if kill:
        spy.kill = True
        checkpointer.save(step, *objects)
        spy.crash(os.path.join(probes, f"crash{rank}.json") if probes else None)
    if probes is None or step != EVERY:
        checkpointer.save(step, *objects)
        return
    fresh = _fresh_objects()
    spy.delay = SLOW_SAVE_S if rank == 0 else 0.0
    checkpointer.save(step, *objects)
    spy.delay = 0.0
    found = _load_at_once(checkpointer_class, folder, fresh)
    with open(os.path.join(probes, f"rank{rank}.json"), "w") as f:
        json.dump({**found, "written": spy.written, "renames": spy.renames}, f)


def _fresh_objects() -> tuple:
    """A second model, DDP, optimizer and scheduler, built as the job builds them, this
    rank's random state left as it was (DDP's constructor is a collective: build it before
    the save, so that it cannot make a rank wait for rank 0's write)."""
    rng = torch.get_rng_state()
    fresh = _build()
    torch.set_rng_state(rng)
    return fresh


def _load_at_once(checkpointer_class: Callable, folder: str, fresh: tuple) -> dict[str, Any]:
    """What a load into `fresh`, right after save() returned, found: the step, or its
    error. The random state is left as it was."""
    rng = torch.get_rng_state()
    try:
        step = checkpointer_class(folder).load(*fresh[1:])
        found = {"step": step, "error": None}
    except Exception as error:  # noqa: BLE001 - the answer's error becomes its hint
        found = {"step": None, "error": f"{type(error).__name__}: {str(error)[:160]}"}
    torch.set_rng_state(rng)
    return found


# -- the true results: an uninterrupted run, and resumes that each miss one piece ------------

def references(_unused: Callable, checkpoint_step: int) -> dict[str, Any] | None:
    """On rank 0: the uninterrupted run's final weights ("full"), and for each piece in
    MISSING the final weights of a resume from `checkpoint_step` without that piece."""
    model, ddp_model, optimizer, scheduler = _build()
    x, y = _data()
    sampler = DistributedSampler(range(SAMPLES), seed=0)
    saved = None
    for step in range(TOTAL):
        if step == checkpoint_step:
            saved = _memory_checkpoint(model, optimizer, scheduler)
        _train_step(step, ddp_model, optimizer, scheduler, sampler, x, y)
    finals = {"full": state_snapshot(model)}
    for piece in MISSING:
        finals[piece] = _resume_without(piece, saved, checkpoint_step, x, y)
    return finals if dist.get_rank() == 0 else None


def _memory_checkpoint(model: nn.Module, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    rank0_rng = [torch.get_rng_state()]
    dist.broadcast_object_list(rank0_rng, src=0)
    return copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(),
                          "rank0_rng": rank0_rng[0]})


def _resume_without(piece: str, saved: dict[str, Any], start: int, x: torch.Tensor,
                    y: torch.Tensor) -> dict[str, torch.Tensor]:
    saved = copy.deepcopy(saved)  # the optimizer keeps these tensors and trains them
    model, ddp_model, optimizer, scheduler = _build()
    sampler = DistributedSampler(range(SAMPLES), seed=0)
    if piece != "model":
        model.load_state_dict(saved["model"])
    if piece != "optimizer":
        optimizer.load_state_dict(saved["optimizer"])
    if piece != "scheduler":
        scheduler.load_state_dict(saved["scheduler"])
    if piece != "rng":
        torch.set_rng_state(saved["rank0_rng"] if piece == "rank0_rng" else saved["rng"])
    for step in range(start, TOTAL):
        _train_step(step, ddp_model, optimizer, scheduler, sampler, x, y)
    return state_snapshot(model)


