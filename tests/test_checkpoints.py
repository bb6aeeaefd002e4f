"""The checkpoint helpers lessons 11 and 14 use: atomic verified files, random state and the
whole training state round-tripped, and the fault injectors' memory limit."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from course_lib.teach import checkpoints as ckpt
from course_lib.teach.checkpoint_views import largest_difference, outcome


def test_atomic_save_writes_the_file_and_its_checksum(tmp_path):
    path = ckpt.checkpoint_path(tmp_path, 3)
    digest = ckpt.atomic_save({"w": torch.arange(4.0)}, path)
    assert path.name == "step-00000003.pt"
    assert (tmp_path / "step-00000003.pt.sha256").read_text() == digest
    assert torch.equal(ckpt.verified_load(path)["w"], torch.arange(4.0))
    assert sorted(os.listdir(tmp_path)) == ["step-00000003.pt", "step-00000003.pt.sha256"]


def test_a_damaged_or_incomplete_checkpoint_is_refused_and_skipped(tmp_path):
    for step in (1, 2, 3):
        ckpt.atomic_save({"step": step}, ckpt.checkpoint_path(tmp_path, step))
    newest = ckpt.checkpoint_path(tmp_path, 3)
    newest.write_bytes(newest.read_bytes()[:-10])  # cut short
    with pytest.raises(ckpt.CorruptCheckpoint, match="does not match"):
        ckpt.verified_load(newest)
    os.remove(str(ckpt.checkpoint_path(tmp_path, 2)) + ".sha256")  # never finished
    with pytest.raises(ckpt.CorruptCheckpoint, match="incomplete"):
        ckpt.verify(ckpt.checkpoint_path(tmp_path, 2))
    assert ckpt.latest_checkpoint(tmp_path) == ckpt.checkpoint_path(tmp_path, 1)
    assert ckpt.latest_checkpoint(tmp_path / "none") is None


def draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_random_state_survives_a_weights_only_file(tmp_path):
    before = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        path = tmp_path / "rng.pt"
        ckpt.atomic_save(ckpt.rng_state(), path)
        first = draws()
        ckpt.set_rng_state(ckpt.verified_load(path))
        assert draws() == first
    finally:
        torch.set_rng_state(before[0])
        np.random.set_state(before[1])
        random.setstate(before[2])


def test_capture_and_restore_continue_training_exactly(tmp_path):
    def setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5)

    def steps(model, optimizer, scheduler, n):
        for _ in range(n):
            model(torch.randn(5, 4)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()

    before = torch.get_rng_state()
    try:
        model, optimizer, scheduler = setup()
        steps(model, optimizer, scheduler, 3)
        ckpt.atomic_save(ckpt.capture(3, model, optimizer, scheduler), tmp_path / "c.pt")
        steps(model, optimizer, scheduler, 3)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        model, optimizer, scheduler = setup()
        state = ckpt.verified_load(tmp_path / "c.pt")
        assert ckpt.restore(state, model, optimizer, scheduler) == 3
        steps(model, optimizer, scheduler, 3)
        assert largest_difference(model.state_dict(), want) == 0
    finally:
        torch.set_rng_state(before)


def test_restore_refuses_another_world_size():
    state = {"model": {}, "rng": [ckpt.rng_state()] * 2, "step": 1}
    with pytest.raises(ValueError, match="random state of 2 ranks"):
        ckpt.restore(state, nn.Module(), torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1))


def test_resume_position():
    assert ckpt.resume_position(10, 6) == (1, 4)
    assert ckpt.resume_position(12, 6) == (2, 0)


def test_outcomes_are_named():
    assert outcome(None, 100, 100) == "the new checkpoint"
    assert outcome(None, 50, 100) == "a stale checkpoint"
    assert outcome(EOFError(), None, 100) == "EOFError (empty file)"
    zip_error = RuntimeError("PytorchStreamReader failed reading zip archive: failed finding")
    assert outcome(zip_error, None, 100) == "partial file (zip error)"


def test_a_memory_limit_makes_a_large_allocation_really_fail():
    code = ("import torch; from course_lib.teach import faults; faults.limit_memory(1 << 28)\n"
            "torch.ones(1 << 20)\n"  # 4 MiB: fine
            "torch.empty(1 << 29)\n")  # 2 GiB: beyond the limit
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert "can't allocate memory" in done.stderr
