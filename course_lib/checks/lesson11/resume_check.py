"""`check_resume` for lesson 11: it launches the training job (`training_job`) with the
learner's Checkpointer, kills it at a random step (at 2 ranks in the middle of a save),
relaunches it, and compares the final weights with the true results; its hints name what the
answer's save or load missed."""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Failure,
    NotWritten,
    Rejected,
    check,
    explain,
    on_ranks,
    stopped_at_stub,
)
from course_lib.checks.lesson11.training_job import EVERY, MISSING, TOTAL, job, references
from course_lib.launching import DistributedError, launch
from course_lib.words import listing

WORLD_SIZES = (2, 3)
IN_SAVE = 2  # at this world size the kill lands in the middle of a save (torch.save)
# A correct resume is bitwise equal at 2 ranks. At 3 ranks it ends about 1e-8 away: a fresh
# DDP reduces its first step's gradients in its initial bucket layout, the uninterrupted run
# (past its first step) in the rebuilt, gradient-ready one; with 3 or more ranks gloo's ring
# sums an element in an order that depends on its place in the bucket (with 2, a + b == b + a).
# Measured: 7.5e-9 on one step at 3 ranks, 1.5e-8 after a resume here; every missing piece
# moved a weight by 1e-2 or more. The comparison allows the rounding, not the mistakes.
TOLERANCE = 1e-6


@check
def check_resume(checkpointer_class: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """Checkpointer(folder) must give save(step, ddp_model, optimizer, scheduler) and
    load(ddp_model, optimizer, scheduler) -> step to continue from (0 when the folder holds
    no checkpoint), such that a job killed at a random step (at 2 ranks: in the middle of a
    save) and relaunched ends with the weights of an uninterrupted run (up to float
    rounding), on every rank. Also judged: a load right after save() returned finds that
    save on every rank; no two ranks write the same file; the weights carry no "module."."""
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
            # a probe's hint is about the first save, not about the kill
            context = "" if isinstance(wrong, _FirstSave) else f", {how}"
            raise Rejected(f"{where}on {n} ranks{context}: {wrong}", wrong.failure) from None
        done.append(f"{n} ({how})")
    return (f"on {listing(done)} ranks, the relaunched job resumed from its last complete "
            f"checkpoint and ended with the uninterrupted run's weights on every rank "
            f"(to within {TOLERANCE:g}); a load right after each save found it.")


def _judge_size(checkpointer_class: Callable, n: int, kill_at: int, in_save: bool,
                timeout: float) -> None:
    with tempfile.TemporaryDirectory(prefix="check11-") as scratch:
        folder, probes = os.path.join(scratch, "checkpoints"), os.path.join(scratch, "probes")
        os.mkdir(folder)
        os.mkdir(probes)
        _first_launch(checkpointer_class, n, folder, (kill_at, in_save, probes), timeout)
        hint = _probe_hint(probes, n, folder) or _prefix_hint(folder)
        if hint:
            raise _FirstSave(hint)
        try:
            results = on_ranks(job, checkpointer_class, n, (folder,), timeout)
        except Rejected as failed:
            if not in_save or failed.failure is None:
                raise
            raise Rejected(failed.failure.explained(_cut_hint(probes, n)),
                           failed.failure) from None
    complete = {kill_at - EVERY, kill_at} if in_save else {kill_at // EVERY * EVERY}
    resumed = results[0]["resumed_at"]
    checkpoint_step = resumed if resumed in complete else max(complete)
    refs = on_ranks(references, checkpointer_class, n, (checkpoint_step,), timeout)[0]
    hint = _resume_hint(results, refs, checkpoint_step)
    if hint:
        raise Rejected(hint)


def _first_launch(checkpointer_class: Callable, n: int, folder: str, plan: tuple,
                  timeout: float) -> None:
    """Run the job until it is killed (`plan`: kill_at, in_save, probes); any other failure
    is the answer's."""
    try:
        launch(job, n, args=(checkpointer_class, folder, *plan), timeout=timeout,
               backend="gloo", echo=False)
    except DistributedError as err:
        if stopped_at_stub(err):
            raise NotWritten(checkpointer_class) from None
        killed = [f for f in err.failures if f.error_type == "SIGKILL"]
        if killed and all(f.error_type == "SIGKILL" or f.is_consequence for f in err.failures):
            return  # the kill, as planned (a peer may fail first in its last collective)
        failure = Failure.of(err, checkpointer_class.__name__, n, timeout)
        raise Rejected(failure.explained(explain(failure)), failure) from None
    raise Rejected("the first launch was not killed at its step: keep the given loop "
                   "(load, then train and save) as it is.")


class _FirstSave(Rejected):
    """A hint from the first save's probe (its rename, its writers, the load right after
    it), not from the kill."""


def _cut_hint(probes: str, n: int) -> str:
    """Why the relaunch could not load what the kill left: the write it cut, as a hint."""
    cut = [_read_json(os.path.join(probes, f"crash{rank}.json")) for rank in range(n)]
    copy = next((c for c in cut if c and c.get("op") == "shutil.copyfile"), None)
    if copy:
        name, tmp = os.path.basename(copy["target"]), os.path.basename(copy["source"])
        return (f"the relaunch could not load the checkpoint the kill left behind: save() "
                f"copied {tmp} onto {name} with shutil.copyfile, and a copy rewrites {name} "
                f"in place, so the kill in the middle of it left half a file there (the "
                f"previous checkpoint was gone). Rename the temporary file instead: "
                f"os.replace({tmp!r}, {name!r}) is atomic, so the name always points at a "
                "complete file.")
    return ("the relaunch could not load the checkpoint the kill left behind: save() wrote "
            "onto the file the relaunch loads, and the kill left half a file there (the "
            "previous checkpoint was gone). Write to a temporary file in the same folder, "
            "then os.replace() it onto the real name: the name then always points at a "
            "complete file.")


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _probe_hint(probes: str, n: int, folder: str) -> str | None:
    """What the first save did and what the loads right after it found, as a hint (None
    when all is well)."""
    found = []
    for rank in range(n):
        with open(os.path.join(probes, f"rank{rank}.json")) as f:
            found.append(json.load(f))
    hint = _rename_hint(found, folder)
    if hint:
        return hint
    writers: dict[str, list[int]] = {}
    for rank, f in enumerate(found):
        for path in set(f["written"]):
            writers.setdefault(path, []).append(rank)
    shared = next(((p, r) for p, r in writers.items() if len(r) > 1), None)
    if shared:
        who = "both" if len(shared[1]) == 2 else "all"
        return (f"ranks {listing(shared[1])} {who} wrote {os.path.basename(shared[0])}: "
                "concurrent writes of one file race (one rank's write can cut another's "
                "short, or a reader sees a mix) and multiply the I/O. Let rank 0 write (gather "
                "the other ranks' random states to it) and the others wait at a barrier, or "
                "give each rank its own file.")
    for rank, f in enumerate(found):
        if f["error"] or f["step"] == 0:  # the file was not there, or not complete yet
            what = f"raised {f['error']}" if f["error"] else "found no checkpoint (step 0)"
            return (f"when rank 0's write was slow, rank {rank} loaded as soon as save("
                    f"{EVERY}, ...) returned, and the load {what}: save() returned before the "
                    "file was written. End save() with dist.barrier() on every rank, so that "
                    "no rank goes on before rank 0 has finished writing.")
    return None


def _rename_hint(found: list[dict[str, Any]], folder: str) -> str | None:
    """A hint when a save renamed a file from outside the checkpoint folder into it."""
    inside = os.path.realpath(folder)
    for f in found:
        for source, target in f["renames"]:
            into = os.path.realpath(os.path.dirname(target)).startswith(inside)
            if into and not os.path.realpath(source).startswith(inside + os.sep):
                where = os.path.dirname(source)
                return (f"save() renamed {source} (in {where}, outside the checkpoint folder) "
                        f"onto {os.path.basename(target)}. os.replace is atomic only on the "
                        "same file system, and on a cluster the temporary folder (tempfile's "
                        "default, /tmp or $TMPDIR) is usually another one than the "
                        "checkpoint folder (NFS, Lustre): there the rename fails with "
                        "OSError: [Errno 18] Invalid cross-device link. Create the temporary "
                        "file in the same folder as the checkpoint (tempfile.mkstemp(dir=folder), "
                        "or path + '.tmp').")
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
