"""Lesson 13's check accepts the worked solution and differently written wrappings that fit
(offload, units of two blocks, fully_shard's default mesh), and rejects plausible wrong ones
(DDP, ZeRO-1, one FSDP unit, reshard_after_forward=False, the root forgotten, the optimizer
built before fully_shard, SGD, AdamW's weight decay, a typed-in learning rate, a bf16
MixedPrecisionPolicy), each with the hint that names what it did."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson13 import check_shard_to_fit

NOTEBOOK = "13_memory_and_sharding.ipynb"
FAST = 30  # seconds a launch: every answer here finishes (or fails) well within it

judged = verdicts_for(NOTEBOOK, FAST)


def offload_per_block(model, lr):
    policy = CPUOffloadPolicy(pin_memory=False)
    for block in model:
        fully_shard(block, offload_policy=policy)  # the default mesh: every rank
    fully_shard(model, offload_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)


def ddp(model, lr):
    model = DDP(model)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def zero1(model, lr):
    model = DDP(model)
    return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=lr)


def one_unit(model, lr):
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def keep_gathered(model, lr):
    for block in model:
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def optimizer_first(model, lr):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, optimizer


def two_block_units(model, lr):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for first in range(0, len(model), 2):
        fully_shard([model[first], model[first + 1]], mesh=mesh)  # one unit of two blocks
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def root_forgotten(model, lr):
    for block in model:
        fully_shard(block)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def adamw(model, lr):
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def lr_typed_in(model, lr):
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def sgd(model, lr):
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def model_only(model, lr):
    for block in model:
        fully_shard(block)
    return fully_shard(model)


def each_linear(model, lr):
    """Correct, written otherwise (the 11-15 review's answer): a unit per Linear, found by
    type, then the root; Adam(foreach=False)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=lr, foreach=False)


def bf16_policy(model, lr):
    """Per block and root, Adam after, but bf16 compute 'to save memory' (review G11)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                  output_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


# A wrapping, and what the check must say of it: ACCEPTED, or the hint naming its mistake.
SHARD_TO_FIT = [
    (Solution("shard_to_fit"), ACCEPTED),
    (offload_per_block, ACCEPTED),
    (two_block_units, ACCEPTED),
    (each_linear, ACCEPTED),
    (ddp, "Every rank kept the whole model, its gradients and Adam's state"),
    (zero1, "Adam's state was sharded (ZeRO-1), but every rank still held all the parameters"),
    (one_unit, "FSDP gathered the whole model at once, from the first layer's forward"),
    (keep_gathered, "that is reshard_after_forward=False"),
    (root_forgotten, "fully_shard was never called on the root"),
    (adamw, "AdamW with weight_decay=0.01"),
    (lr_typed_in, "was given lr=0.003, but the optimizer it returned uses lr=0.001"),
    (optimizer_first, "build the optimizer after wrapping"),
    (sgd, "the weights differ from one-process torch.optim.Adam(lr=0.001)"),
    (model_only, "must return (model, optimizer)"),
    (bf16_policy, "the layers computed with torch.bfloat16 weights"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_shard_to_fit, SHARD_TO_FIT))
def test_the_check_judges_the_wrapping(check, answer, hint, capsys):
    judged(check, answer, hint, capsys)
