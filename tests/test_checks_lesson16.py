"""Lesson 16's check accepts the worked plan and other correct plans, and rejects plausible
wrong plans, each with the hint that names what that plan did."""

import pytest
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson16 import check_parallelize

NOTEBOOK = "16_tensor_parallel.ipynb"
judged = verdicts_for(NOTEBOOK, 30)


def plan_with(up, down, head, blocks=(0, 1), extra=None):
    """A plan from the styles of up, down and head (a style or None), for the given blocks."""
    plan = {} if head is None else {"head": head}
    for i in blocks:
        plan[f"blocks.{i}.up"] = up()
        plan[f"blocks.{i}.down"] = down()
    return {**plan, **(extra or {})}


def embedding_too(model, mesh):
    """torchtitan's way: the embedding row-parallel as well (its output all-reduced)."""
    plan = plan_with(ColwiseParallel, RowwiseParallel, ColwiseParallel(use_local_output=False),
                     extra={"embed": RowwiseParallel(input_layouts=Replicate())})
    parallelize_module(model, mesh, plan)  # in place; returns nothing


def explicit_layouts(model, mesh):
    """The defaults spelled out: the same plan."""
    plan = plan_with(lambda: ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1)),
                     lambda: RowwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate()),
                     ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    return parallelize_module(model, mesh, plan)


def swapped(model, mesh):
    """up row-parallel and down column-parallel: 'the output features are the weight's rows'."""
    return parallelize_module(model, mesh, plan_with(
        RowwiseParallel, ColwiseParallel, ColwiseParallel(use_local_output=False)))


def gathered_after_each_layer(model, mesh):
    gather = lambda: ColwiseParallel(output_layouts=Replicate())  # noqa: E731 - a style factory
    return parallelize_module(model, mesh, plan_with(
        gather, gather, ColwiseParallel(use_local_output=False)))


def local_logits(model, mesh):
    """The head's default ColwiseParallel: the loss gets this rank's plain slice."""
    return parallelize_module(model, mesh, plan_with(
        ColwiseParallel, RowwiseParallel, ColwiseParallel()))


def gathered_logits(model, mesh):
    head = ColwiseParallel(output_layouts=Replicate(), use_local_output=False)
    return parallelize_module(model, mesh, plan_with(ColwiseParallel, RowwiseParallel, head))


def head_left_whole(model, mesh):
    return parallelize_module(model, mesh, plan_with(ColwiseParallel, RowwiseParallel, None))


def first_block_only(model, mesh):
    return parallelize_module(model, mesh, plan_with(
        ColwiseParallel, RowwiseParallel, ColwiseParallel(use_local_output=False), blocks=(0,)))


def head_misspelt(model, mesh):
    plan = plan_with(ColwiseParallel, RowwiseParallel, None,
                     extra={"lm_head": ColwiseParallel(use_local_output=False)})
    return parallelize_module(model, mesh, plan)


def up_misspelt(model, mesh):
    """'blocks.0.fc1' matches nothing: up stays whole and down, row-parallel, fails on it."""
    plan = plan_with(ColwiseParallel, RowwiseParallel, ColwiseParallel(use_local_output=False))
    plan["blocks.0.fc1"] = plan.pop("blocks.0.up")
    return parallelize_module(model, mesh, plan)


def up_only(model, mesh):
    """Only the wide up-projections split: down gets a slice as if it were the whole input."""
    plan = plan_with(ColwiseParallel, RowwiseParallel, ColwiseParallel(use_local_output=False))
    return parallelize_module(model, mesh, {k: v for k, v in plan.items() if "down" not in k})


def dtensors_in_the_blocks(model, mesh):
    """use_local_output=False everywhere: the residual adds a DTensor to a plain tensor."""
    return parallelize_module(model, mesh, plan_with(
        lambda: ColwiseParallel(use_local_output=False),
        lambda: RowwiseParallel(use_local_output=False), ColwiseParallel(use_local_output=False)))


PARALLELIZE = [
    (Solution("parallelize"), ACCEPTED),
    (embedding_too, ACCEPTED),
    (explicit_layouts, ACCEPTED),
    (swapped, "on 2 ranks, a layer got an input whose features do not match its plan"),
    (gathered_after_each_layer, "the blocks' forward issued 4 collectives, 2 per block "
                                "(blocks.0.up: 1 all_gather"),
    (local_logits, "the loss got a plain tensor with only this rank's slice of the vocabulary"),
    (gathered_logits, "the logits reached the loss whole on every rank"),
    (head_left_whole, "head.weight is whole on every rank"),
    (first_block_only, "blocks.1.up.weight and blocks.1.down.weight are whole on every rank"),
    (head_misspelt, "parallelize_module skipped the plan key 'lm_head': it names no submodule"),
    (up_misspelt, "parallelize_module skipped the plan key 'fc1'"),  # torch names the token
    (up_only, "a layer outside the plan received the slice of features"),
    (dtensors_in_the_blocks, "a DTensor met a plain tensor inside the model"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_parallelize, PARALLELIZE))
def test_the_parallelize_check_judges_the_answer(check, answer, hint, capsys):
    """A right plan passes; a wrong one fails with the hint that names what it did."""
    judged(check, answer, hint, capsys)
