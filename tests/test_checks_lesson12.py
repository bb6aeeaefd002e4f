"""Lesson 12's check accepts the worked solution and a differently written correct answer, and
rejects plausible wrong answers, each with the hint that names what changed between runs."""

import os
import random

import numpy as np
import pytest
import torch
from checking import check_helpers

from course_lib.checks.lesson12 import check_seed_rank

NOTEBOOK = "12_reproducibility.ipynb"

solution, accepts, rejects = check_helpers(NOTEBOOK)


def seed_from_env(base_seed):
    rank = int(os.environ["RANK"])
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # what CUDA would need; harmless here
    torch.use_deterministic_algorithms(True, warn_only=False)
    for seed_fn in (random.seed, np.random.seed, torch.random.manual_seed):
        seed_fn(base_seed + rank)


def seed_like_the_guides(base_seed):
    """PyTorch's reproducibility notes, cuDNN flags included (they matter on GPUs only)."""
    seed = base_seed + int(os.environ["RANK"])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def cudnn_flags_instead(base_seed):
    """The cuDNN flags in place of deterministic algorithms: the CPU embedding backward
    stays nondeterministic."""
    seed = base_seed + int(os.environ["RANK"])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_nothing(base_seed):
    return None


def seed_same_everywhere(base_seed):
    random.seed(base_seed)
    np.random.seed(base_seed)
    torch.manual_seed(base_seed)
    torch.use_deterministic_algorithms(True)


def seed_torch_only(base_seed):
    torch.manual_seed(base_seed + int(os.environ["RANK"]))
    torch.use_deterministic_algorithms(True)


def seed_without_numpy(base_seed):
    rank = int(os.environ["RANK"])
    random.seed(base_seed + rank)
    torch.manual_seed(base_seed + rank)
    torch.use_deterministic_algorithms(True)


def seed_not_deterministic(base_seed):
    rank = int(os.environ["RANK"])
    random.seed(base_seed + rank)
    np.random.seed(base_seed + rank)
    torch.manual_seed(base_seed + rank)


def seed_rank_only(base_seed):
    rank = int(os.environ["RANK"])
    random.seed(rank)
    np.random.seed(rank)
    torch.manual_seed(rank)
    torch.use_deterministic_algorithms(True)


def seed_then_draw(base_seed):
    seed_from_env(base_seed)
    torch.randn(3)  # a draw after seeding: reproducible, but not the recipe's stream


@pytest.mark.parametrize("fn", ["solution", seed_from_env, seed_like_the_guides])
def test_seed_rank_accepts(fn, capsys):
    fn = solution("seed_rank") if fn == "solution" else fn
    accepts(check_seed_rank, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (seed_nothing, "on 2 ranks, rank 0's torch generator started from another seed in each run"),
    (seed_same_everywhere, "every rank drew the same augmentation noise and dropout masks"),
    (seed_torch_only, "with num_workers=0 (augmentation in the rank itself), the "
                      "augmentation's Python's random draws on rank 0 changed"),
    (seed_without_numpy, "the augmentation's NumPy draws on rank 0 changed"),
    (seed_not_deterministic, "Call torch.use_deterministic_algorithms(True)"),
    (cudnn_flags_instead, "Call torch.use_deterministic_algorithms(True)"),
    (seed_rank_only, "rank 0's generators (torch, Python's random, NumPy) are not seeded "
                     "with base_seed + rank = 1234"),
    (seed_then_draw, "are not those of the recipe"),
])
def test_seed_rank_rejects(fn, hint, capsys):
    rejects(check_seed_rank, fn, hint, capsys)
