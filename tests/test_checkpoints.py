"""The checkpoint helpers lessons 11 and 14 use: atomic verified files, random state and the
whole training state round-tripped; the clean stop on SIGTERM (preemption); the fault
injectors' memory limit and SaveSpy."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from course_lib.teach import checkpoints as ckpt
from course_lib.teach import preemption
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


class Noisy(Dataset):
    """Eight points with augmentation noise drawn in the DataLoader worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i)]) + torch.randn(1)


def loader_from(state=None, persistent_workers=False):
    """The lesson's loader: one worker, 4 batches an epoch, seeded by its generator."""
    generator = torch.Generator().manual_seed(7)
    if state is not None:
        generator.set_state(state)
    return DataLoader(Noisy(), batch_size=2, sampler=DistributedSampler(Noisy(), 1, 0, seed=0),
                      num_workers=1, generator=generator, persistent_workers=persistent_workers)


def batches(loader, step, save_at=None, stale=False):
    """Lesson 11's loop from `step` to the end of epoch 2: the batches, and the generator
    state a checkpoint after step `save_at` holds (`stale`: the epoch-start state always,
    the recipe before the fix)."""
    epoch, skip = ckpt.resume_position(step, len(loader))
    seen, saved = [], None
    while epoch < 3:
        loader.sampler.set_epoch(epoch)
        start = loader.generator.get_state()
        for i, batch in enumerate(loader):
            if i < skip:
                continue
            step += 1
            seen.append(batch)
            if step == save_at:
                saved = start if stale else ckpt.loader_state_after(i, loader, start)
        epoch, skip = epoch + 1, 0
    return seen, saved


@pytest.mark.parametrize("save_at", [4, 6, 8])  # 4 batches an epoch: 4 and 8 end an epoch
def test_a_resume_draws_the_uninterrupted_runs_worker_noise(save_at):
    full, state = batches(loader_from(), 0, save_at)
    resumed, _ = batches(loader_from(state), save_at)
    assert len(resumed) == len(full) - save_at
    assert all(torch.equal(a, b) for a, b in zip(full[save_at:], resumed))


def test_the_epoch_start_state_after_an_epochs_last_batch_repeats_its_noise():
    """The recipe before the fix: off after an epoch boundary (so the test above can fail)."""
    full, state = batches(loader_from(), 0, save_at=4, stale=True)
    resumed, _ = batches(loader_from(state), 4)
    assert not torch.equal(full[4], resumed[0])


def test_persistent_workers_are_refused_with_what_to_do():
    loader = loader_from(persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers=False"):
        ckpt.loader_state_after(0, loader, loader.generator.get_state())


# The job of the SIGTERM test below, written to a file: its Dataset, then its body.
STOPPING_DEFS = """
import signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from course_lib.teach import preemption
class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.01)
        return i
"""
STOPPING_BODY = """
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
fixed, start_method = sys.argv[1] == "ignore", sys.argv[2]
after = 0
init = preemption.ignore_sigterm if fixed else None
loader = DataLoader(Slow(), num_workers=1, worker_init_fn=init,
                    multiprocessing_context=start_method)
hold = fixed and start_method != "forkserver"  # iter_holding_sigterm refuses a forkserver
for n, _ in enumerate(preemption.iter_holding_sigterm(loader) if hold else iter(loader)):
    if n == 5:
        print("ready", flush=True)
    after += bool(stop)
    if after == 10:  # the last step and the save, with the workers still needed
        print("stopped cleanly", flush=True)
        break
"""


@pytest.mark.parametrize("hold", [True, False])
def test_a_sigterm_while_a_worker_starts_is_held_back_until_it_ignores_it(hold):
    """PyTorch installs its own SIGTERM handler in a new worker before worker_init_fn."""
    code = ("import os, signal, sys\n"
            "from torch.utils.data import DataLoader\n"
            "from course_lib.teach import preemption\n"
            "def init(i):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)  # the signal lands before the init\n"
            "    preemption.ignore_sigterm(i)\n"
            "loader = DataLoader(range(4), num_workers=1, worker_init_fn=init)\n"
            "hold = sys.argv[1] == 'hold'\n"
            "it = preemption.iter_holding_sigterm(loader) if hold else iter(loader)\n"
            "print(sum(int(b) for b in it))\n")
    done = subprocess.run([sys.executable, "-c", code, "hold" if hold else "no"],
                          capture_output=True, text=True, timeout=120)
    if hold:
        assert (done.returncode, done.stdout.strip()) == (0, "6"), done.stderr
    else:
        assert done.returncode != 0 and "DataLoader worker" in done.stderr


@pytest.mark.parametrize(("workers", "start_method"), [
    ("ignore", "fork"), ("ignore", "spawn"), ("default", "fork"), ("ignore", "forkserver")])
def test_sigterm_to_the_process_group_leaves_the_loader_running_when_workers_ignore_it(
        workers, start_method, tmp_path):
    """torchrun's SIGTERM goes to the rank's process group (its DataLoader workers too).
    Workers the rank starts itself (fork, spawn) that ignore it keep the loader running. A
    forkserver (Python 3.14's default on Linux) is in the group too and dies of it, and its
    workers, whose parent it is, stop with it: the recipe needs fork or spawn."""
    script = tmp_path / "job.py"  # a file: spawned workers import its Dataset from it
    script.write_text(STOPPING_DEFS + "if __name__ == '__main__':\n"
                      + textwrap.indent(STOPPING_BODY, "    "))
    job = subprocess.Popen([sys.executable, script, workers, start_method],
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    assert job.stdout.readline().strip() == "ready"
    os.killpg(job.pid, signal.SIGTERM)
    out, err = job.communicate(timeout=120)
    if workers == "ignore" and start_method != "forkserver":
        assert (job.returncode, out.strip()) == (0, "stopped cleanly"), err
    else:
        assert job.returncode != 0 and "DataLoader worker" in err, (out, err)


def test_holding_sigterm_refuses_workers_started_from_a_forkserver():
    loader = DataLoader(range(4), num_workers=1, multiprocessing_context="forkserver")
    with pytest.raises(ValueError, match='multiprocessing_context="fork"'):
        preemption.iter_holding_sigterm(loader)
    assert preemption.worker_start_method(DataLoader(range(4))) is None  # no workers
    assert preemption.worker_start_method(DataLoader(range(4), num_workers=1,
                                               multiprocessing_context="spawn")) == "spawn"


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


def test_save_spy_follows_a_file_through_its_rename_and_ignores_memory(tmp_path):
    import io

    from course_lib.teach.faults import SaveSpy

    with SaveSpy() as spy:
        torch.save({"w": torch.ones(2)}, io.BytesIO())  # in memory: not a file
        torch.save({"w": torch.ones(2)}, tmp_path / "c.pt.tmp")
        os.replace(tmp_path / "c.pt.tmp", tmp_path / "c.pt")
    assert spy.written == [str(tmp_path / "c.pt")]
    assert torch.save is not spy._save  # put back


SPY_JOB = """
import json, os, shutil, sys, torch
from course_lib.teach.faults import SaveSpy
folder, how = sys.argv[1], sys.argv[2]
path, tmp = os.path.join(folder, "c.pt"), os.path.join(folder, "c.pt.tmp")
torch.save({"w": torch.zeros(1 << 16)}, path)  # the previous checkpoint
with SaveSpy() as spy:
    spy.kill = True
    new = {"w": torch.ones(1 << 16)}
    if how == "in place":
        torch.save(new, path)
    elif how == "copy":
        torch.save(new, tmp)
        shutil.copyfile(tmp, path)
    elif how == "shared":  # another rank writes c.pt too, and its crash moved it first
        torch.save(new, tmp)
        os.replace(tmp, path)
        os.rename(path, os.path.join(folder, "c.pt.tmp1"))  # not through the spy: not ours
    else:  # temporary file, rename, clean up an older file
        torch.save(new, tmp)
        os.replace(tmp, path)
        os.remove(os.path.join(folder, "old.pt"))
    spy.crash(os.path.join(folder, "report.json"))
"""


@pytest.mark.parametrize(("how", "cut"), [("in place", "torch.save"), ("copy", "shutil.copyfile"),
                                          ("atomic", "torch.save")])
def test_save_spy_leaves_the_files_of_a_save_cut_half_way(tmp_path, how, cut):
    """The crash cuts the save's most dangerous write: a file written in place, a copy onto
    the name; an atomic save is cut in its temporary file, with the rename (and the removal
    after it) undone, so the previous checkpoint is intact."""
    torch.save({"w": torch.zeros(1)}, tmp_path / "old.pt")
    done = subprocess.run([sys.executable, "-c", SPY_JOB, str(tmp_path), how], timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["op"] == cut
    full = tmp_path / "full.pt"
    torch.save({"w": torch.ones(1 << 16)}, full)
    if how == "atomic":
        assert torch.load(tmp_path / "c.pt")["w"].sum() == 0  # the previous checkpoint
        assert (tmp_path / "old.pt").exists()  # its removal came after the cut write
        cut_file = tmp_path / "c.pt.tmp"
    else:
        cut_file = tmp_path / "c.pt"
    assert 0.45 < cut_file.stat().st_size / full.stat().st_size < 0.55
    with pytest.raises(RuntimeError):
        torch.load(cut_file)


def test_save_spy_crash_when_another_rank_moved_the_file(tmp_path):
    """Ranks that write one file crash together: one rank's undo may find the file gone
    (the other's undo moved it). The crash still kills, and says which write it cut (CI on
    torch 2.11 saw 'No such file or directory: c.pt -> c.pt.tmp0' raised instead)."""
    torch.save({"w": torch.zeros(1)}, tmp_path / "old.pt")
    job = SPY_JOB.replace("os.rename(path", "spy._saved['rename'](path")
    done = subprocess.run([sys.executable, "-c", job, str(tmp_path), "shared"], timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["op"] == "torch.save"


def test_save_spy_records_renames_and_copies(tmp_path):
    import shutil

    from course_lib.teach.faults import SaveSpy

    with SaveSpy() as spy:
        torch.save({"w": torch.ones(2)}, tmp_path / "a.tmp")
        shutil.copy(tmp_path / "a.tmp", tmp_path / "b.pt")
        os.replace(tmp_path / "a.tmp", tmp_path / "a.pt")
    assert spy.written == [str(tmp_path / "a.pt"), str(tmp_path / "b.pt")]
    assert spy.renames == [(str(tmp_path / "a.tmp"), str(tmp_path / "a.pt"))]
    assert shutil.copyfile is spy._saved["copyfile"]  # put back


def test_random_state_needs_numpy_only_where_it_is_loaded():
    """An exported script copies these helpers and may run where numpy is not installed:
    without numpy the state holds torch's and Python's generators and round-trips."""
    code = ("import sys; sys.modules['numpy'] = None  # as if not installed\n"
            "import random, torch\n"
            "from course_lib.teach import checkpoints as ckpt\n"
            "state = ckpt.rng_state(); a = (torch.rand(2), random.random())\n"
            "ckpt.set_rng_state(state); b = (torch.rand(2), random.random())\n"
            "print(sorted(state), torch.equal(a[0], b[0]) and a[1] == b[1])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "['python', 'torch'] True", done.stderr


def _both_gathers():
    """every_rank_rng_state() and torch's all_gather_object of the same states."""
    import torch.distributed as dist

    torch.manual_seed(10 + dist.get_rank())
    ours = ckpt.every_rank_rng_state()
    theirs = [None] * dist.get_world_size()
    dist.all_gather_object(theirs, ckpt.rng_state())
    same = all(torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"]
               for a, b in zip(ours, theirs))
    return same, len({bytes(s["torch"].tolist()) for s in ours})


def test_every_ranks_random_state_is_gathered_without_all_gather_object():
    """Two all_gathers of pickled bytes give what all_gather_object gives (which needs numpy),
    every rank's own state, in rank order."""
    from course_lib import launch

    for same, distinct in launch(_both_gathers, 3, backend="gloo", echo=False).results:
        assert same and distinct == 3
