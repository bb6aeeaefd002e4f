"""Lesson 14's check runs the learner's main() under torchrun --standalone at 2 and 3 ranks:
it accepts the worked solution and a differently written correct main(), and rejects
plausible wrong ones, each with the hint that names what went wrong."""

import os
import sys

import pytest
import torch.distributed as dist
from checking import check_helpers

from course_lib.checks.lesson14 import check_main, one_process, train

NOTEBOOK = "14_torchrun.ipynb"

solution, accepts, rejects = check_helpers(NOTEBOOK)


def main_env_defaults():
    dist.init_process_group("gloo")  # env://: reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    train(sys.argv[1])
    dist.destroy_process_group()


def main_no_group():
    train(sys.argv[1])


def main_nccl():
    dist.init_process_group("nccl")
    train(sys.argv[1])
    dist.destroy_process_group()


def main_two_ranks():
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=2)
    train(sys.argv[1])
    dist.destroy_process_group()


def main_rank_zero_trains():
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        train(sys.argv[1])
    dist.destroy_process_group()


def main_own_folder():
    dist.init_process_group("gloo")
    os.makedirs("/tmp/lesson14-results", exist_ok=True)
    train("/tmp/lesson14-results")
    dist.destroy_process_group()


@pytest.mark.parametrize("fn", ["solution", main_env_defaults])
def test_check_main_accepts(fn, capsys):
    accepts(check_main, solution("main") if fn == "solution" else fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (main_no_group, "at 2 ranks your main_no_group() failed: train() found no process group"),
    (main_nccl, "the NCCL backend needs GPUs"),
    (main_two_ranks, "at 3 ranks your main_two_ranks() failed: a rank is out of range for the "
                     "world size you gave"),
    (main_rank_zero_trains, "every rank must call train(), not only rank 0"),
    (main_own_folder, "train() wrote no final.pt into the folder given on the command line"),
])
def test_check_main_rejects(fn, hint, capsys):
    rejects(check_main, fn, hint, capsys)


def test_the_true_result_is_one_process_on_the_whole_batch():
    """A positive control: one process gives other weights with another batch order."""
    a, b = one_process(), one_process(steps=3)
    assert set(a) == {"weight", "bias"} and not all((a[k] == b[k]).all() for k in a)
