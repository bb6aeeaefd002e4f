"""Lesson 13's check accepts the worked solution and differently written wrappings that fit
(offload, units of two blocks, fully_shard's default mesh), and rejects plausible wrong ones
(DDP, ZeRO-1, one FSDP unit, reshard_after_forward=False, the root forgotten, the optimizer
built before fully_shard, SGD, AdamW's weight decay, a typed-in learning rate), each with the
hint that names what it did."""

import pytest
import torch
import torch.distributed as dist
from checking import check_helpers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.lesson13 import check_shard_to_fit

NOTEBOOK = "13_memory_and_sharding.ipynb"
FAST = 30  # seconds a launch: every answer here finishes (or fails) well within it

solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)


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


@pytest.mark.parametrize("fn", ["solution", offload_per_block, two_block_units])
def test_shard_to_fit_accepts(fn, capsys):
    fn = solution("shard_to_fit") if fn == "solution" else fn
    accepts(check_shard_to_fit, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
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
])
def test_shard_to_fit_rejects(fn, hint, capsys):
    rejects(check_shard_to_fit, fn, hint, capsys)
