"""Lesson 14's check runs the learner's main() under torchrun as one node of 3 workers and as
two nodes of 1 worker, and once with train() made to raise: it accepts the worked solution
and a differently written correct main(), and rejects plausible wrong ones, each with the
hint that names what this answer did."""

import contextlib
import os
import sys

import pytest
import torch
import torch.distributed as dist
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson14 import check_main, one_process, train

NOTEBOOK = "14_torchrun.ipynb"

judged = verdicts_for(NOTEBOOK)


def main_env_defaults():
    dist.init_process_group("gloo")  # env://: reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    try:
        train(sys.argv[1])
    finally:
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
    """Saves into a folder of its own choosing (here the given folder's parent, which the
    check removes: no fixed path that two test runs would share), not the one given."""
    dist.init_process_group("gloo")
    train(os.path.dirname(sys.argv[1]))
    dist.destroy_process_group()


def main_local_rank():
    """Right on one node, where LOCAL_RANK is RANK; on two nodes both workers are rank 0."""
    dist.init_process_group("gloo", rank=int(os.environ["LOCAL_RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    train(sys.argv[1])
    dist.destroy_process_group()


def main_local_numbers():
    dist.init_process_group("gloo", rank=int(os.environ["LOCAL_RANK"]),
                            world_size=int(os.environ["LOCAL_WORLD_SIZE"]))
    try:
        train(sys.argv[1])
    finally:
        dist.destroy_process_group()


def main_never_destroys():
    dist.init_process_group("gloo")
    train(sys.argv[1])


def main_no_finally():
    dist.init_process_group("gloo")
    train(sys.argv[1])
    dist.destroy_process_group()  # skipped when train() raises


def main_swallows():
    dist.init_process_group("gloo")
    try:
        train(sys.argv[1])
    except Exception as err:  # noqa: BLE001 (the mistake this answer makes)
        print("training failed:", err)
    finally:
        dist.destroy_process_group()


def main_nccl_if_cuda():
    """NCCL whenever torch sees a GPU (the 11-15 review's G6 answer): on a node of more
    processes than GPUs, ranks 1 and up ask for a GPU that is not there."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        train(sys.argv[1])
    finally:
        dist.destroy_process_group()


def main_exit_stack():
    """Correct, written otherwise (the review's answer): env:// with no rank or size, the
    backend by the node's GPU count, destroy on an ExitStack."""
    here = int(os.environ["LOCAL_WORLD_SIZE"])
    use_nccl = here <= torch.cuda.device_count()
    if use_nccl:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    with contextlib.ExitStack() as stack:
        dist.init_process_group("nccl" if use_nccl else "gloo", init_method="env://")
        stack.callback(dist.destroy_process_group)
        train(sys.argv[1])


# A main(), and what the check must say of it: ACCEPTED, or the hint that names its mistake.
MAINS = [
    (Solution("main"), ACCEPTED),
    (main_env_defaults, ACCEPTED),
    (main_no_group, "as one node (3 ranks) your main_no_group() failed: train() found no "
                    "process group"),
    (main_exit_stack, ACCEPTED),
    (main_nccl, "your main_nccl() chose the NCCL backend: on a real one, ranks 1 and up fail"),
    (main_nccl_if_cuda, "torch.cuda.is_available() only says that there is a GPU; choose "
                        "'nccl' only when"),  # review G6
    (main_two_ranks, "passed init_process_group world_size=2 where torchrun set WORLD_SIZE=3 "
                     "(a number typed in"),
    (main_rank_zero_trains, "every rank must call train(), not only rank 0"),
    (main_own_folder, "train() wrote no final.pt into the folder given on the command line"),
    (main_local_rank, "as two nodes (2 ranks) your main_local_rank() passed init_process_group "
                      "rank=0 where torchrun set RANK=1 (that is LOCAL_RANK"),
    (main_local_numbers, "world_size=1 where torchrun set WORLD_SIZE=2 (that is "
                         "LOCAL_WORLD_SIZE"),
    (main_never_destroys, "your main_never_destroys() returned with the process group still "
                          "initialized: call dist.destroy_process_group()"),
    (main_no_finally, "when train() raised, your main_no_finally() raised with the process "
                      "group still initialized"),  # review G12: not "returned"
    (main_swallows, "when train() raised, your main_swallows() returned normally"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_main, MAINS))
def test_the_check_judges_the_main(check, answer, hint, capsys):
    """A right main() passes; a wrong one fails with the hint that names what it did."""
    judged(check, answer, hint, capsys)


def test_the_true_result_is_one_process_on_the_whole_batch():
    """A positive control: one process gives other weights with another batch order."""
    a, b = one_process(), one_process(steps=3)
    assert set(a) == {"weight", "bias"} and not all((a[k] == b[k]).all() for k in a)
