"""Lesson 13's memory accounting: the formula's arithmetic, the meter on one process, and the
calculator widget's figures against the bytes real ranks measured for the lesson's runs."""

import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach import memory, memory_plan

LAYERS, WIDTH = 4, 256
N_PARAMS = LAYERS * (WIDTH * WIDTH + WIDTH)
LAYER_PARAMS = WIDTH * WIDTH + WIDTH


def test_adam_costs_16_bytes_per_parameter_in_every_layout():
    for precision in memory.PRECISIONS:
        got = memory.predict(1000, 1, "DDP", precision, "Adam", bucket_view=True)
        states = got["parameters"] + got["gradients"] + got["optimizer state"]
        assert states == 16_000


def test_pytorch_bf16_keeps_fp32_state_and_deepspeed_does_not():
    pytorch = memory.predict(1000, 8, "ZeRO-1", "bf16 PyTorch", bucket_view=True)
    assert pytorch == {"parameters": 4000, "gradients": 4000, "optimizer state": 1000,
                       "gathered parameters": 2000}  # autocast's bf16 copies of the weights
    deepspeed = memory.predict(1000, 8, "ZeRO-1", "bf16 DeepSpeed", bucket_view=True)
    assert deepspeed == {"parameters": 2000, "gradients": 2000, "optimizer state": 1500,
                         "gathered parameters": 0}
    fsdp = memory.predict(1000, 8, "FSDP2", "bf16 PyTorch", unit_params=100)
    assert fsdp["gathered parameters"] == 200  # MixedPrecisionPolicy gathers in bf16


def test_ddp_buckets_are_a_second_copy_of_the_gradients_unless_views():
    assert memory.predict(1000, 2, "DDP")["gradients"] == 8000
    assert memory.predict(1000, 2, "DDP", bucket_view=True)["gradients"] == 4000
    assert memory.predict(1000, 2, "FSDP2")["gradients"] == 2000


def test_offload_leaves_only_the_gathered_unit_on_the_device():
    counts = {"parameters": 10, "gradients": 10, "optimizer state": 20,
              "gathered parameters": 40, "unsharded gradients": 30}
    assert memory.device_bytes(counts, offloaded=False) == 110
    assert memory.device_bytes(counts, offloaded=True) == 70


def test_each_strategy_divides_its_parts():
    n = 4
    assert memory.predict(1000, n, "ZeRO-1", bucket_view=True) == {
        "parameters": 4000, "gradients": 4000, "optimizer state": 2000,
        "gathered parameters": 0.0}
    assert memory.predict(1000, n, "ZeRO-2")["gradients"] == 1000
    fsdp = memory.predict(1000, n, "FSDP2", unit_params=100)
    assert fsdp == {"parameters": 1000, "gradients": 1000, "optimizer state": 2000,
                    "gathered parameters": 400}


@pytest.mark.parametrize("kwargs, words", [
    ({"strategy": "ZeRO-3"}, "strategy must be one of"),
    ({"precision": "fp8"}, "precision must be one of"),
    ({"n_params": 0}, "must be positive"),
])
def test_bad_input_says_what_to_pass(kwargs, words):
    args = {"n_params": 10, "world_size": 2, "strategy": "DDP", **kwargs}
    with pytest.raises(ValueError, match=words):
        memory.predict(**args)


def test_meter_counts_activations_but_not_the_weights_autograd_saves():
    meter = memory.Meter()
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters())
    with meter.forward(model):
        loss = model(torch.randn(5, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    counts = meter.measure(model, optimizer)
    n = sum(p.numel() for p in model.parameters())
    assert counts["parameters"] == counts["gradients"] == 4 * n
    assert counts["optimizer state"] == 8 * n + 4 * 4  # two moments, four step counters
    # saved: the input (5x8), tanh's output (5x16, also the 2nd linear's input), the output
    # (5x4, for pow); never a weight
    assert counts["activations"] == 4 * (5 * 8 + 5 * 16 + 5 * 4)
    assert counts["gathered parameters"] == 0


def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                           for _ in range(LAYERS)])


def _wrap(name, model):
    if name == "FSDP2":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters())
    model = DDP(model, gradient_as_bucket_view=True)
    if name == "ZeRO-1":
        return model, ZeroRedundancyOptimizer(model.parameters(),
                                              optimizer_class=torch.optim.Adam)
    return model, torch.optim.Adam(model.parameters())


def _measure_each():
    counts = {}
    for name in ("DDP", "ZeRO-1", "FSDP2"):
        meter = memory.Meter()
        model, optimizer = _wrap(name, _model())
        with meter.forward(model):
            loss = F.mse_loss(model(torch.randn(4, WIDTH)), torch.zeros(4, WIDTH))
        loss.backward()
        optimizer.step()
        counts[name] = meter.measure(model, optimizer)
    return counts


def _calculator_figures(strategy, world_size):
    """What the widget shows for the lesson's configuration, parsed back to bytes."""
    box = memory_plan.calculator()
    n, ranks, chosen, precision, optimizer, unit, view, out = box.children
    n.value, ranks.value, chosen.value = N_PARAMS, world_size, strategy
    precision.value, optimizer.value, view.value = "fp32", "Adam", True
    unit.value = 100 * LAYER_PARAMS / N_PARAMS
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    found = re.findall(r"([a-z ]+): ([\d.]+) (B|KiB|MiB|GiB)<br>", out.value)
    return {part: float(value) * units[unit] for part, value, unit in found}


@pytest.mark.parametrize("world_size", [2, 4])
def test_calculator_matches_what_ranks_measured(world_size):
    results = launch(_measure_each, world_size, echo=False, backend="gloo").results
    for strategy in ("DDP", "ZeRO-1", "FSDP2"):
        shown = _calculator_figures(strategy, world_size)
        assert set(shown) == {"parameters", "gradients", "optimizer state",
                              "gathered parameters"}
        for rank, counts in enumerate(results):
            for part, value in shown.items():
                got = counts[strategy][part]
                assert abs(got - value) <= 0.01 * max(value, 1), (
                    strategy, world_size, rank, part, got, value)


def test_calculator_world_size_moves_through_powers_of_two():
    """The world size is picked from 1, 2, 4, ..., 1024 (a linear 1-1024 slider made 2, 4
    and 8 hard to pick), and the other labels are given room (issue 36 item 5)."""
    ranks = memory_plan.calculator().children[1]
    assert list(ranks.options) == [2**k for k in range(11)] and ranks.value == 8
