"""Checks for lesson 11's exercise: a Checkpointer whose save/load make a training job that
is killed at a random step, or in the middle of a save, and relaunched end with the weights of
an uninterrupted run."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Failure,
    Rejected,
    explain,
    listing,
    on_ranks,
    run_check,
    state_snapshot,
)
from course_lib.checks.result import CheckResult
from course_lib.launching import DistributedError, launch
from course_lib.teach.faults import SaveSpy

WORLD_SIZES = (2, 3)
IN_SAVE = 2  # at this world size the kill lands in the middle of a save (torch.save)
TOTAL, EVERY = 14, 3  # steps in all; a checkpoint every EVERY steps
SLOW_SAVE_S = 0.5  # rank 0's first torch.save waits this long: a rank that does not wait sees it
# A correct resume is bitwise equal at 2 ranks. At 3 ranks it ends about 1e-8 away: a fresh
# DDP reduces its first step's gradients in its initial bucket layout, the uninterrupted run
# (past its first step) in the rebuilt, gradient-ready one; with 3 or more ranks gloo's ring
# sums an element in an order that depends on its place in the bucket (with 2, a + b == b + a).
# Measured: 7.5e-9 on one step at 3 ranks, 1.5e-8 after a resume here; every missing piece
# moved a weight by 1e-2 or more. The comparison allows the rounding, not the mistakes.
TOLERANCE = 1e-6
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


def _job(checkpointer_class: Callable, folder: str, kill_at: int | None = None,
         in_save: bool = False, probes: str | None = None) -> dict[str, Any]:
    """The given loop: load, train to TOTAL saving every EVERY steps, die after step
    `kill_at` (`in_save`: in the middle of that step's save). With `probes`, right after the
    first save every rank loads it into fresh objects and writes what it found there."""
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
                      scheduler), folder, probes if step == EVERY else None, in_save and
                      step == kill_at)
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # the job dies here, on every rank
    return {"resumed_at": resumed_at, "weights": state_snapshot(model)}


def _save(checkpointer_class: Callable, checkpointer: Any, spy: SaveSpy, step: int,
          objects: tuple, folder: str, probes: str | None, kill: bool) -> None:
    """checkpointer.save, killed half-way through its torch.save (`kill`), or probed."""
    if probes is None:
        spy.kill = kill
        checkpointer.save(step, *objects)
        return
    fresh = _fresh_objects()
    spy.delay = SLOW_SAVE_S if dist.get_rank() == 0 else 0.0
    checkpointer.save(step, *objects)
    spy.delay = 0.0
    found = _load_at_once(checkpointer_class, folder, fresh)
    with open(os.path.join(probes, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({**found, "written": spy.written}, f)


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

def _references(_unused: Callable, checkpoint_step: int) -> dict[str, Any] | None:
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


# -- the check ----------------------------------------------------------------------------

def check_resume(checkpointer_class: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Checkpointer(folder) must give save(step, ddp_model, optimizer, scheduler) and
    load(ddp_model, optimizer, scheduler) -> step to continue from (0 when the folder holds
    no checkpoint), such that a job killed at a random step (at 2 ranks: in the middle of a
    save) and relaunched ends with the weights of an uninterrupted run (up to float
    rounding), on every rank. Also judged: a load right after save() returned finds that
    save on every rank; no two ranks write the same file; the weights carry no "module."."""
    def judge() -> str:
        rng = random.Random()  # a private generator: the kernel's random state is left alone
        done = []
        for n in WORLD_SIZES:
            in_save = n == IN_SAVE
            kill_at = (rng.choice(range(2 * EVERY, TOTAL, EVERY)) if in_save
                       else rng.choice([s for s in range(EVERY + 1, TOTAL - 1) if s % EVERY]))
            how = (f"killed in the middle of step {kill_at}'s save" if in_save
                   else f"killed after step {kill_at}")
            try:
                _judge_size(checkpointer_class, n, kill_at, in_save, timeout)
            except Rejected as wrong:
                where = f"right on {listing(done)} ranks; " if done else ""
                raise Rejected(f"{where}on {n} ranks, {how}: {wrong}", wrong.failure) from None
            done.append(f"{n} ({how})")
        return (f"on {listing(done)} ranks, the relaunched job resumed from its last complete "
                f"checkpoint and ended with the uninterrupted run's weights on every rank "
                f"(to within {TOLERANCE:g}); a load right after each save found it.")
    return run_check("check_resume", checkpointer_class, judge)


def _judge_size(checkpointer_class: Callable, n: int, kill_at: int, in_save: bool,
                timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="check11-") as scratch:
        folder, probes = os.path.join(scratch, "checkpoints"), os.path.join(scratch, "probes")
        os.mkdir(folder)
        os.mkdir(probes)
        _first_launch(checkpointer_class, n, folder, (kill_at, in_save, probes), timeout)
        hint = _probe_hint(probes, n) or _prefix_hint(folder)
        if hint:
            raise Rejected(hint)
        try:
            results = on_ranks(_job, checkpointer_class, n, (folder,), timeout)
        except Rejected as failed:
            if not in_save or failed.failure is None:
                raise
            raise Rejected(failed.failure.explained(
                "the relaunch could not load the checkpoint the kill left behind: save() "
                "wrote onto the file the relaunch loads, and the kill left half a file there "
                "(the previous checkpoint was gone). Write to a temporary file in the same "
                "folder, then os.replace() it onto the real name: the name then always "
                "points at a complete file."), failed.failure) from None
    complete = {kill_at - EVERY, kill_at} if in_save else {kill_at // EVERY * EVERY}
    resumed = results[0]["resumed_at"]
    checkpoint_step = resumed if resumed in complete else max(complete)
    refs = on_ranks(_references, checkpointer_class, n, (checkpoint_step,), timeout)[0]
    hint = _resume_hint(results, refs, checkpoint_step)
    if hint:
        raise Rejected(hint)


def _first_launch(checkpointer_class: Callable, n: int, folder: str, plan: tuple,
                  timeout: float) -> None:
    """Run the job until it is killed (`plan`: kill_at, in_save, probes); any other failure
    is the answer's."""
    try:
        launch(_job, n, args=(checkpointer_class, folder, *plan), timeout=timeout,
               backend="gloo", echo=False)
    except DistributedError as err:
        if any(f.error_type == "NotImplementedError" for f in err.failures):
            raise NotImplementedError(
                f"{checkpointer_class.__name__}() is not written yet: replace its TODO with your "
                "code, run that cell, then run this check again.") from None
        killed = [f for f in err.failures if f.error_type == "SIGKILL"]
        if killed and all(f.error_type == "SIGKILL" or f.is_consequence for f in err.failures):
            return  # the kill, as planned (a peer may fail first in its last collective)
        failure = Failure.of(err, checkpointer_class.__name__, n, timeout)
        raise Rejected(failure.explained(explain(failure)), failure) from None
    raise Rejected("the first launch was not killed at its step: keep the given loop "
                   "(load, then train and save) as it is.")


def _probe_hint(probes: str, n: int) -> str | None:
    """What the loads right after the first save found, as a hint (None when all is well)."""
    found = []
    for rank in range(n):
        with open(os.path.join(probes, f"rank{rank}.json")) as f:
            found.append(json.load(f))
    writers: dict[str, list[int]] = {}
    for rank, f in enumerate(found):
        for path in set(f["written"]):
            writers.setdefault(path, []).append(rank)
    shared = next(((p, r) for p, r in writers.items() if len(r) > 1), None)
    if shared:
        return (f"ranks {listing(shared[1])} all wrote {os.path.basename(shared[0])}: "
                "concurrent writes of one file race (one rank's write can cut another's "
                "short, or a reader sees a mix) and multiply the I/O. Let rank 0 write (gather "
                "the other ranks' random states to it) and the others wait at a barrier, or "
                "give each rank its own file.")
    for rank, f in enumerate(found):
        if f["error"] or f["step"] == 0:  # the file was not there, or not complete yet
            what = f"raised {f['error']}" if f["error"] else "found no checkpoint (step 0)"
            return (f"when rank 0's write was slow, a load on rank {rank} right after save("
                    f"{EVERY}, ...) returned {what}: save() returned before the file was "
                    "written. End save() with dist.barrier() on every rank, so that no rank "
                    "goes on before rank 0 has finished writing.")
    return None


def _prefix_hint(folder: str) -> str | None:
    """A hint when a file in `folder` holds the weights under DDP's "module." prefix."""
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                saved = torch.load(os.path.join(root, name), map_location="cpu",
                                   weights_only=True)
            except Exception:  # noqa: BLE001 - not a torch file: nothing to judge
                continue
            if _has_prefixed_weights(saved):
                return (f"{name} holds the weights as 'module.0.weight', ...: the DDP "
                        "wrapper's state_dict. A plain model (an evaluation script, another "
                        "job without DDP) cannot load it. Save ddp_model.module.state_dict() "
                        "and load into ddp_model.module.")
    return None


def _has_prefixed_weights(value: Any) -> bool:
    if isinstance(value, dict):
        if any(isinstance(k, str) and k.startswith("module.0.") for k in value):
            return True
        return any(_has_prefixed_weights(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_prefixed_weights(v) for v in value)
    return False


def _resume_hint(results: list[dict[str, Any]], refs: dict[str, Any],
                 checkpoint_step: int) -> str | None:
    """None when every rank ended with the uninterrupted run's weights, else the hint."""
    resumed = [r["resumed_at"] for r in results]
    if any(not isinstance(s, int) or isinstance(s, bool) for s in resumed):
        return (f"load() returned {resumed[0]!r}; return the step to continue from, an int "
                "(the step saved in the checkpoint; 0 when there is none).")
    if set(resumed) != {checkpoint_step}:
        wrong = next(r for r, s in enumerate(resumed) if s != checkpoint_step)
        return (f"after the relaunch, load() returned step {resumed[wrong]} on rank {wrong}, "
                f"but the last checkpoint was saved at step {checkpoint_step}: return the "
                "step save() was given, on every rank (save it in the checkpoint).")
    full = refs["full"]
    finals = [r["weights"] for r in results]
    if all(_equal(w, full) for w in finals):
        return None
    if not all(_equal(w, finals[0]) for w in finals):
        odd = next(r for r, w in enumerate(finals) if not _equal(w, finals[0]))
        return (f"after the resume, rank {odd}'s weights differ from rank 0's: DDP copies "
                "rank 0's weights only when it is built, so every rank must load the "
                "checkpoint (and wait, with a barrier, for rank 0 to finish writing it).")
    for piece, hint in MISSING.items():
        if _equal(finals[0], refs[piece]):
            return f"the resumed run ended as a resume where {hint}."
    return ("the resumed run ended with other weights than the uninterrupted run: "
            "restore the model, optimizer and scheduler state_dicts and each rank's "
            "torch RNG state exactly as they were at the saved step.")


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Equal weights, up to TOLERANCE."""
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and (a[k] - b[k]).abs().max().item() <= TOLERANCE for k in b)
