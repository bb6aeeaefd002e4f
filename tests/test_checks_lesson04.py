"""Lesson 04's checks accept the worked solutions and differently written correct answers, and
reject plausible wrong answers, each with the hint that names what went wrong."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson04 import check_gradient_differences, check_wrap_model

NOTEBOOK = "04_gradient_sync.ipynb"
FAST = 10  # seconds a launch: wrong answers that desync ranks fail fast, never wait this long


judged = verdicts_for(NOTEBOOK, FAST)


# -- wrap_model -------------------------------------------------------------------------------

def wrap_keywords(model):
    return DDP(module=model, find_unused_parameters=True, bucket_cap_mb=1,
               gradient_as_bucket_view=True)


def wrap_defaults(model):
    return DDP(model)


def wrap_static(model):
    return DDP(model, static_graph=True)


def wrap_frozen(model):
    model.head_b.requires_grad_(False)  # the fix for a head that is never trained
    return DDP(model)


def wrap_device_generic(model):
    device_ids = [torch.accelerator.current_device_index()] if torch.accelerator.is_available() \
        else None
    device = torch.accelerator.current_accelerator(check_available=True) or "cpu"
    return DDP(model.to(device), device_ids=device_ids, find_unused_parameters=True)


def wrap_nothing(model):
    return model


def wrap_a_copy(model):
    return DDP(copy.deepcopy(model), find_unused_parameters=True)


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
WRAP_MODEL = [
    (Solution("wrap_model"), ACCEPTED),
    (wrap_keywords, ACCEPTED),
    (wrap_device_generic, ACCEPTED),
    (wrap_defaults, "on 2 ranks, training stopped at step 1 with DDP's \"Expected to have "
                    "finished reduction in the prior iteration\": in step 0 (task a) head_b got "
                    "no gradient"),
    (wrap_static, "training stopped at step 2 (task b)"),
    (wrap_static, "static_graph=True promises that every step uses the same parameters"),
    (wrap_frozen, "you froze head_b (requires_grad False), but this job trains it at steps "
                  "2, 4: freezing is for a part the job never trains. Then on 2 ranks, training "
                  "stopped at step 3"),
    (wrap_nothing, "returned a MultiTask, not a DistributedDataParallel"),
    (wrap_a_copy, "wraps another module, not the model you were given"),
]


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


def differences_with_neighbour(model):
    rank, size = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, p in model.named_parameters():
        mine, theirs = p.grad.clone(), torch.empty_like(p.grad)
        sent = dist.isend(mine, (rank + 1) % size)
        dist.recv(theirs, (rank - 1) % size)
        sent.wait()
        gap = (mine - theirs).abs().max().reshape(1)
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        out[name] = gap.item()
    return out


def differences_with_partner(model):
    """Each rank against rank ^ 1 (pairs 0-1, 2-3): all pairs at 2 ranks only."""
    out = {}
    for name, p in model.named_parameters():
        everyone = [torch.empty_like(p.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, p.grad)
        partner = everyone[dist.get_rank() ^ 1]
        gap = (p.grad - partner).abs().max().reshape(1)
        dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        out[name] = gap.item()
    return out


def differences_as_tensors_by_objects(model):
    grads = {name: p.grad.tolist() for name, p in model.named_parameters()}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, grads)
    return {name: float((torch.tensor([g[name] for g in everyone]).amax(0)
                         - torch.tensor([g[name] for g in everyone]).amin(0)).max())
            for name in grads}


GRADIENT_DIFFERENCES = [
    (Solution("gradient_differences"), ACCEPTED),
    (differences_by_gather, ACCEPTED),
    (differences_as_tensors_by_objects, ACCEPTED),
    (differences_local, "Compare across ranks with a collective"),
    (differences_of_norms, "Its norm is the same on every rank"),
    (differences_from_rank0, "your answer was right on 2 ranks but not on 4: fc1.weight: you "
                             "reported 0.75, the largest difference from rank 0's gradient"),
    (differences_with_neighbour, "right on 2 ranks but not on 4: fc2.weight: you reported 0.4, "
                                 "the largest difference between neighbouring ranks"),
    (differences_with_partner, "right on 2 ranks but not on 4: fc1.weight: you reported 0.5, "
                               "expected 1"),
    (differences_on_rank0_only, "every rank must get the result"),
    (differences_weights_only, "has no entry for fc1.bias, fc2.bias"),
    (differences_sum_trick, "your answer was right on 2 ranks but not on 4: fc1.weight: you "
                            "reported"),
]


@pytest.mark.parametrize("check, answer, hint", [
    *cases(check_wrap_model, WRAP_MODEL),
    *cases(check_gradient_differences, GRADIENT_DIFFERENCES),
])
def test_the_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)
