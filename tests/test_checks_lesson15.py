"""Lesson 15's check accepts the worked fix and a differently written correct one, and
rejects plausible wrong fixes (case 4's sampler split by the local rank among them, caught
at 4 ranks run as 2 nodes) and wrong lists of pitfalls, each with the hint that names what
the run showed."""

import os
from contextlib import ExitStack, nullcontext

import pytest
import torch
import torch.distributed as dist
from checking import check_helpers
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson15 import check_fixed_train, findings, run_script
from course_lib.teach.cases.colleague import BATCH, K, colleague_train

NOTEBOOK = "15_case_files.ipynb"
FAST = 20  # seconds a launch: every answer here finishes (or fails) well within it

solution = check_helpers(NOTEBOOK, FAST)[0]
judged = verdicts_for(NOTEBOOK, FAST)


def _loop(model, optimizer, loader, divide=True, sync_every=False):
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % K == 0
        with nullcontext() if last or sync_every else model.no_sync():
            loss = nn.functional.mse_loss(model(x), y)
            (loss / K if divide else loss).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()


def _sampled(dataset, shuffle=True):
    sampler = DistributedSampler(dataset, shuffle=shuffle)
    return DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def _save(model, path, wrapper=False):
    if dist.get_rank() == 0:
        torch.save((model if wrapper else model.module).state_dict(), path)


def in_order_with_exit_stack(model, optimizer, dataset, checkpoint_path):
    """Correct, written otherwise: no shuffling, micro-batches grouped by hand."""
    batches = list(_sampled(dataset, shuffle=False))
    for start in range(0, len(batches), K):
        group = batches[start:start + K]
        for j, (x, y) in enumerate(group):
            with ExitStack() as stack:
                if j < len(group) - 1:
                    stack.enter_context(model.no_sync())
                (nn.functional.mse_loss(model(x), y) / len(group)).backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    _save(model, checkpoint_path)


def sampler_only(model, optimizer, dataset, checkpoint_path):
    _loop(model, optimizer, _sampled(dataset), sync_every=True)
    _save(model, checkpoint_path, wrapper=True)


def sampler_and_no_sync(model, optimizer, dataset, checkpoint_path):
    _loop(model, optimizer, _sampled(dataset))
    _save(model, checkpoint_path, wrapper=True)


def not_divided_by_k(model, optimizer, dataset, checkpoint_path):
    _loop(model, optimizer, _sampled(dataset), divide=False)
    _save(model, checkpoint_path)


def never_synchronised(model, optimizer, dataset, checkpoint_path):
    for i, (x, y) in enumerate(_sampled(dataset)):
        with model.no_sync():
            (nn.functional.mse_loss(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad()
    _save(model, checkpoint_path)


def printing_on_every_rank(model, optimizer, dataset, checkpoint_path):
    """Right in every measured way, but every rank prints the same log line (P16)."""
    _loop(model, optimizer, _sampled(dataset))
    print("training done, saving the checkpoint")
    _save(model, checkpoint_path)


def sampler_by_local_rank(model, optimizer, dataset, checkpoint_path):
    """Lesson 15 case 4's bug: the sampler told the machine's GPU count and this GPU."""
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["LOCAL_WORLD_SIZE"]),
                                 rank=int(os.environ["LOCAL_RANK"]))
    _loop(model, optimizer, DataLoader(dataset, batch_size=BATCH, sampler=sampler))
    _save(model, checkpoint_path)


def no_checkpoint(model, optimizer, dataset, checkpoint_path):
    _loop(model, optimizer, _sampled(dataset))


def saved_before_training(model, optimizer, dataset, checkpoint_path):
    _save(model, checkpoint_path)
    _loop(model, optimizer, _sampled(dataset))


def env_sampler_stripped_prefix(model, optimizer, dataset, checkpoint_path):
    """Correct, written otherwise (the 11-15 review's answer): the sampler told WORLD_SIZE
    and RANK explicitly, no shuffling, the wrapper's state_dict saved with 'module.'
    stripped."""
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), shuffle=False)
    _loop(model, optimizer, DataLoader(dataset, batch_size=BATCH, sampler=sampler))
    if dist.get_rank() == 0:
        state = model.state_dict()
        nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "module.")
        torch.save(state, checkpoint_path)
    dist.barrier()


def backward_only_in_no_sync(model, optimizer, dataset, checkpoint_path):
    """no_sync() around loss.backward() only: the forward ran outside it (review)."""
    for i, (x, y) in enumerate(_sampled(dataset)):
        loss = nn.functional.mse_loss(model(x), y) / K
        last = (i + 1) % K == 0
        with nullcontext() if last else model.no_sync():
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    _save(model, checkpoint_path)


def shuffle_beside_sampler(model, optimizer, dataset, checkpoint_path):
    """Keeps the colleague's shuffle=True next to sampler= (review): DataLoader refuses it."""
    loader = DataLoader(dataset, batch_size=BATCH, sampler=DistributedSampler(dataset),
                        shuffle=True)
    _loop(model, optimizer, loader)
    _save(model, checkpoint_path)


# A fix of the colleague's function, and what the check must say of it: ACCEPTED, or the hint
# that names what its run showed.
FIXED_TRAIN = [
    (Solution("train"), ACCEPTED),
    (in_order_with_exit_stack, ACCEPTED),
    (env_sampler_stripped_prefix, ACCEPTED),
    (colleague_train, "on 2 ranks: 96 of 96 samples were read by more than one rank"),
    (colleague_train, "On this run the x-ray found: P03 ("),
    (sampler_only, "On this run the x-ray found: P09 ("),
    (printing_on_every_rank, "on 2 ranks the x-ray found: P16 ("),
    (sampler_only, "rank 0 made 12 all-reduces for 3 optimizer steps"),
    (sampler_and_no_sync, "the checkpoint's keys start with 'module.'"),
    (not_divided_by_k, "a learning rate 4 times too large: divide each micro-batch's loss by K"),
    (never_synchronised, "rank 0 made 0 all-reduces for 3 optimizer steps"),
    (no_checkpoint, "no checkpoint at checkpoint_path"),
    (sampler_by_local_rank, "on 4 ranks: 192 of 192 samples were read by more than one rank (on "
                            "2 nodes of 2, rank 0 and rank 2 (local rank 0 of each node)"),
    (saved_before_training, "the checkpoint's 0.weight, 0.bias, 2.weight and 2.bias differ"),
    (backward_only_in_no_sync, "but the forward ran outside it"),
    (shuffle_beside_sampler, "DataLoader refuses shuffle=True beside sampler= (P18"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_fixed_train, FIXED_TRAIN))
def test_the_check_judges_the_fix(check, answer, hint, capsys):
    judged(check, answer, hint, capsys)


@pytest.mark.parametrize("named, hint", [
    ({"P03", "P09"}, "you missed P12 (checkpoint saved from the DDP wrapper"),
    ({"P09", "P12"}, "you missed P03 (no DistributedSampler): running the colleague's function"),
    ({"P03", "P09", "P12", "P04"}, "you named P04, but running the colleague's function"),
    (None, "pitfalls_found() must return the ids you found, as a set such as"),
])
def test_pitfalls_named_rejects(named, hint, capsys):
    result = check_fixed_train(solution("train"), lambda: named, timeout=FAST)
    assert not result.passed and hint in result.message, result.message
    capsys.readouterr()


def test_the_colleagues_function_shows_its_three_pitfalls_at_both_sizes():
    for n in (2, 4):
        assert set(findings(run_script(colleague_train, n, FAST))) == {"P03", "P09", "P12"}
