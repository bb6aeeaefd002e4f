"""Lesson 11's check accepts the worked Checkpointer and a differently written correct one,
and rejects plausible wrong ones, each with the hint that names what the resume missed."""

import os
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson11 import check_resume
from course_lib.teach import checkpoints as ckpt

NOTEBOOK = "11_checkpoints.ipynb"
FAST = 30

judged = verdicts_for(NOTEBOOK, FAST)


class WithCourseHelpers:
    """The lesson's helpers: atomic verified files, every rank's RNG (torch, numpy, python)."""

    def __init__(self, folder):
        self.folder = folder

    def save(self, step, ddp_model, optimizer, scheduler):
        state = ckpt.capture(step, ddp_model, optimizer, scheduler)
        if dist.get_rank() == 0:
            ckpt.atomic_save(state, ckpt.checkpoint_path(self.folder, step))
        dist.barrier()

    def load(self, ddp_model, optimizer, scheduler):
        path = ckpt.latest_checkpoint(self.folder)
        if path is None:
            return 0
        return ckpt.restore(ckpt.verified_load(path), ddp_model, optimizer, scheduler)


class OneFilePerRank:
    """Each rank writes its own file, atomically: no collective needed for the random state."""

    def __init__(self, folder):
        self.folder = folder

    def path(self):
        return os.path.join(self.folder, f"rank{dist.get_rank()}.pt")

    def save(self, step, ddp_model, optimizer, scheduler):
        torch.save({"step": step, "model": ddp_model.module.state_dict(),
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "rng": torch.get_rng_state()}, self.path() + ".tmp")
        os.replace(self.path() + ".tmp", self.path())

    def load(self, ddp_model, optimizer, scheduler):
        if not os.path.exists(self.path()):
            return 0
        state = torch.load(self.path(), map_location="cpu")
        ddp_model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        return state["step"]


class Missing(OneFilePerRank):
    """OneFilePerRank, with one piece not restored (`leave_out`)."""

    leave_out = ""

    def load(self, ddp_model, optimizer, scheduler):
        if not os.path.exists(self.path()):
            return 0
        state = torch.load(self.path(), map_location="cpu")
        ddp_model.module.load_state_dict(state["model"])
        if self.leave_out != "optimizer":
            optimizer.load_state_dict(state["optimizer"])
        if self.leave_out != "scheduler":
            scheduler.load_state_dict(state["scheduler"])
        if self.leave_out != "rng":
            torch.set_rng_state(state["rng"])
        return state["step"]


class NoOptimizer(Missing):
    leave_out = "optimizer"


class NoScheduler(Missing):
    leave_out = "scheduler"


class NoRng(Missing):
    leave_out = "rng"


class RankZeroRng(OneFilePerRank):
    """Rank 0 saves its own random state only, and every rank loads it."""

    def save(self, step, ddp_model, optimizer, scheduler):
        if dist.get_rank() == 0:
            torch.save({"step": step, "model": ddp_model.module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state()},
                       self.path() + ".tmp")
            os.replace(self.path() + ".tmp", self.path())
        dist.barrier()

    def path(self):
        return os.path.join(self.folder, "ckpt.pt")


class NextStep(OneFilePerRank):
    """Returns the step after the saved one: one step is skipped."""

    def load(self, ddp_model, optimizer, scheduler):
        step = super().load(ddp_model, optimizer, scheduler)
        return step + 1 if step else 0


class WeightsOnRankZero(OneFilePerRank):
    """Only rank 0 loads the weights, counting on DDP to copy them (it does so only when it
    is built)."""

    def load(self, ddp_model, optimizer, scheduler):
        if not os.path.exists(self.path()):
            return 0
        state = torch.load(self.path(), map_location="cpu")
        if dist.get_rank() == 0:
            ddp_model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        return state["step"]


class RankZeroWrites:
    """Rank 0 writes every rank's state (`atomic`: temp file + os.replace; `barrier`)."""

    atomic, barrier, inner = True, True, True

    def __init__(self, folder):
        self.path = os.path.join(folder, "checkpoint.pt")

    def save(self, step, ddp_model, optimizer, scheduler):
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, torch.get_rng_state())
        if dist.get_rank() == 0:
            model = ddp_model.module if self.inner else ddp_model
            state = {"step": step, "model": model.state_dict(), "rng": rng,
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            torch.save(state, self.path + ".tmp" if self.atomic else self.path)
            if self.atomic:
                os.replace(self.path + ".tmp", self.path)
        if self.barrier:
            dist.barrier()

    def load(self, ddp_model, optimizer, scheduler):
        if not os.path.exists(self.path):
            return 0
        state = torch.load(self.path, map_location="cpu")
        (ddp_model.module if self.inner else ddp_model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"][dist.get_rank()])
        return state["step"]


class InPlace(RankZeroWrites):
    """torch.save straight onto the checkpoint (a kill in the middle leaves half a file)."""

    atomic = False


class NoBarrier(RankZeroWrites):
    barrier = False


class WrapperKeys(RankZeroWrites):
    """Saves and loads the DDP wrapper's state_dict: 'module.' in every key."""

    inner = False


class EveryRankWrites(RankZeroWrites):
    """Every rank writes the same file, each through its own temporary file."""

    def save(self, step, ddp_model, optimizer, scheduler):
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, torch.get_rng_state())
        state = {"step": step, "model": ddp_model.module.state_dict(), "rng": rng,
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
        tmp = f"{self.path}.tmp{dist.get_rank()}"
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        dist.barrier()


class TmpThenCopy(RankZeroWrites):
    """torch.save to a temporary file, then shutil.copyfile onto the name (the 11-15 review's
    answer): the copy rewrites the checkpoint in place."""

    def save(self, step, ddp_model, optimizer, scheduler):
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, torch.get_rng_state())
        if dist.get_rank() == 0:
            torch.save({"step": step, "model": ddp_model.module.state_dict(), "rng": rng,
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, self.path + ".tmp")
            shutil.copyfile(self.path + ".tmp", self.path)
        dist.barrier()


class TempFileInTmp(RankZeroWrites):
    """tempfile.mkstemp() in the system's temporary folder, then os.replace onto the name
    (the review's answer): on a cluster another file system, where the rename fails."""

    def save(self, step, ddp_model, optimizer, scheduler):
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, torch.get_rng_state())
        if dist.get_rank() == 0:
            fd, tmp = tempfile.mkstemp(suffix=".pt")
            with os.fdopen(fd, "wb") as f:
                torch.save({"step": step, "model": ddp_model.module.state_dict(), "rng": rng,
                            "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict()}, f)
            os.replace(tmp, self.path)
        dist.barrier()


class TempFileBeside(TempFileInTmp):
    """Correct: tempfile.mkstemp(dir=...) in the checkpoint's folder, then os.replace."""

    def save(self, step, ddp_model, optimizer, scheduler):
        rng = [None] * dist.get_world_size()
        dist.all_gather_object(rng, torch.get_rng_state())
        if dist.get_rank() == 0:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save({"step": step, "model": ddp_model.module.state_dict(), "rng": rng,
                            "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict()}, f)
            os.replace(tmp, self.path)
        dist.barrier()


# A Checkpointer, and what the check must say of it: ACCEPTED for the worked one and correct
# ones written otherwise (rank 0 writing every rank's state atomically, the course's helpers,
# one file per rank), else the hint that must name what its resume missed.
CHECKPOINTERS = [
    (Solution("Checkpointer"), ACCEPTED),
    (RankZeroWrites, ACCEPTED),
    (WithCourseHelpers, ACCEPTED),
    (OneFilePerRank, ACCEPTED),
    (TempFileBeside, ACCEPTED),
    (InPlace, "os.replace() it onto the real name"),  # a kill in the middle damages the file
    # the probe of the first save names it, without the kill's context (review G12)
    (NoBarrier, "on 2 ranks: when rank 0's write was slow, rank 1 loaded as soon as save(3"),
    (TmpThenCopy, "copied checkpoint.pt.tmp onto checkpoint.pt with shutil.copyfile"),  # G5
    (TempFileInTmp, "Invalid cross-device link"),  # G5
    (WrapperKeys, "Save ddp_model.module.state_dict()"),
    (EveryRankWrites, "wrote checkpoint.pt: concurrent writes"),
    (NoOptimizer, "momentum buffers"),
    (NoScheduler, "scheduler restarted"),
    (NoRng, "random state was not restored"),
    (RankZeroRng, "every rank got rank 0's random state"),
    (NextStep, "but the last checkpoint was saved at step"),  # a step off by one
    (WeightsOnRankZero, "weights differ from rank 0's"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_resume, CHECKPOINTERS))
def test_the_check_judges_the_checkpointer(check, answer, hint, capsys):
    """A right Checkpointer passes; a wrong one fails with the hint that names what its
    resume missed."""
    judged(check, answer, hint, capsys)
