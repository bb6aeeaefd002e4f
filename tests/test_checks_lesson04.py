"""Lesson 04's checks accept the worked solutions and differently written correct answers, and
reject plausible wrong answers, each with the hint that names what went wrong."""

import copy

import pytest
import torch
import torch.distributed as dist
from checking import check_helpers
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib.checks.lesson04 import check_gradient_differences, check_wrap_model

NOTEBOOK = "04_gradient_sync.ipynb"
FAST = 6  # seconds: wrong answers that desynchronise ranks fail fast, never wait this long


solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)



# -- wrap_model -------------------------------------------------------------------------------

def wrap_keywords(model):
    return DDP(module=model, find_unused_parameters=True, bucket_cap_mb=1,
               gradient_as_bucket_view=True)


def wrap_defaults(model):
    return DDP(model)


def wrap_static(model):
    return DDP(model, static_graph=True)


def wrap_nothing(model):
    return model


def wrap_a_copy(model):
    return DDP(copy.deepcopy(model), find_unused_parameters=True)


@pytest.mark.parametrize("fn", ["solution", wrap_keywords])
def test_wrap_model_accepts(fn, capsys):
    fn = solution("wrap_model") if fn == "solution" else fn
    accepts(check_wrap_model, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (wrap_defaults, "Tell DDP that some parameters may go unused: find_unused_parameters=True"),
    (wrap_static, "static_graph=True promises that the same parameters are used in every step"),
    (wrap_nothing, "returned a MultiTask, not a DistributedDataParallel"),
    (wrap_a_copy, "wraps another module, not the model you were given"),
])
def test_wrap_model_rejects(fn, hint, capsys):
    rejects(check_wrap_model, fn, hint, capsys)


# -- gradient_differences ---------------------------------------------------------------------

def differences_by_gather(model):
    out = {}
    for name, p in model.named_parameters():
        everyone = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, p.grad)
        stacked = torch.stack(everyone)
        out[name] = float((stacked.max(0).values - stacked.min(0).values).max())
    return out


def differences_local(model):
    return {name: (p.grad - p.grad).abs().max().item() for name, p in model.named_parameters()}


def differences_of_norms(model):
    out = {}
    for name, p in model.named_parameters():
        high, low = p.grad.norm().reshape(1), p.grad.norm().reshape(1)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        out[name] = (high - low).item()
    return out


def differences_from_rank0(model):
    out = {}
    for name, p in model.named_parameters():
        rank0 = p.grad.clone()
        dist.broadcast(rank0, src=0)
        gap = (p.grad - rank0).abs().max().reshape(1)
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        out[name] = gap.item()
    return out


def differences_on_rank0_only(model):
    out = {}
    for name, p in model.named_parameters():
        everyone = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())] \
            if dist.get_rank() == 0 else None
        dist.gather(p.grad, everyone, dst=0)
        if dist.get_rank() == 0:
            stacked = torch.stack(everyone)
            out[name] = float((stacked.max(0).values - stacked.min(0).values).max())
    return out


def differences_weights_only(model):
    out = {}
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            high, low = p.grad.clone(), p.grad.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            out[name] = (high - low).max().item()
    return out


def differences_sum_trick(model):
    out = {}
    for name, p in model.named_parameters():
        total = p.grad.clone()
        dist.all_reduce(total)
        gap = (total - dist.get_world_size() * p.grad).abs().max().reshape(1)
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        out[name] = gap.item()
    return out


@pytest.mark.parametrize("fn", ["solution", differences_by_gather])
def test_gradient_differences_accepts(fn, capsys):
    fn = solution("gradient_differences") if fn == "solution" else fn
    accepts(check_gradient_differences, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (differences_local, "Compare across ranks with a collective"),
    (differences_of_norms, "Its norm is the same on every rank"),
    (differences_from_rank0, "the largest difference from rank 0's gradient"),
    (differences_on_rank0_only, "every rank must get the result"),
    (differences_weights_only, "has no entry for fc1.bias, fc2.bias"),
    (differences_sum_trick, "fc1.weight: you reported"),
])
def test_gradient_differences_rejects(fn, hint, capsys):
    rejects(check_gradient_differences, fn, hint, capsys)


def test_a_stub_says_not_written_yet():
    def wrap_model(model):
        raise NotImplementedError("TODO")

    with pytest.raises(NotImplementedError, match=r"wrap_model\(\) is not written yet"):
        check_wrap_model(wrap_model, timeout=FAST)
