"""Exercise checks judge behaviour on real ranks: each accepts the worked solution and a
differently written correct answer, and rejects plausible wrong answers with the right hint."""

import os

import pytest
import torch
import torch.distributed as dist
from checking import accepts, load_solution, rejects

from course_lib.checks.lesson00 import check_rank_summary, check_same_random
from course_lib.checks.lesson01 import check_average_gradients, check_broadcast_parameters

solution = load_solution


# -- lesson 00: rank_summary ----------------------------------------------------------------

def summary_by_gather(x):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, x)
    return [dist.get_rank(), dist.get_world_size(), sum(values)]


def summary_no_reduce(x):
    return dist.get_rank(), dist.get_world_size(), x


def summary_reduce_to_rank0(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.reduce(t, dst=0)
    return dist.get_rank(), dist.get_world_size(), t.item()


def summary_two_ranks(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return dist.get_rank(), 2, t.item()


def summary_env_strings(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return os.environ["RANK"], os.environ["WORLD_SIZE"], t.item()


def summary_average(x):
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item() / dist.get_world_size()


def summary_reduced_copy_returned_x(x):
    total = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(total)
    return dist.get_rank(), dist.get_world_size(), x


def summary_with_neighbour(x):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, x)
    rank = dist.get_rank()
    return rank, dist.get_world_size(), x + values[(rank + 1) % len(values)]


def summary_scalar_reduce(x):
    total = torch.tensor(x)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return int(os.environ["RANK"]), dist.get_world_size(), float(total)


@pytest.mark.parametrize("fn", ["solution", summary_by_gather, summary_scalar_reduce])
def test_rank_summary_accepts(fn, capsys):
    fn = solution("00_welcome.ipynb", "rank_summary") if fn == "solution" else fn
    accepts(check_rank_summary, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (summary_no_reduce, "no rank called a collective"),
    (summary_reduced_copy_returned_x, "although it called a collective"),
    (summary_with_neighbour, "with 3 ranks and x = [2.375, 4.875, 7.375], the ranks reported"),
    (summary_reduce_to_rank0, "only rank 0 has the right total"),
    (summary_two_ranks, "with 3 ranks, rank 0 reported world_size=2"),
    (summary_env_strings, "rank 0 returned rank='0', a str"),
    (summary_average, "the average"),
])
def test_rank_summary_rejects(fn, hint, capsys):
    rejects(check_rank_summary, fn, hint, capsys)


# -- lesson 00: same_random ------------------------------------------------------------------

def random_same_seed(n):
    generator = torch.Generator().manual_seed(1234)
    return torch.rand(n, generator=generator)


def random_unsynced(n):
    return torch.rand(n)


def random_summed(n):
    numbers = torch.rand(n)
    dist.all_reduce(numbers)
    return numbers


def random_broadcast_copy(n):
    numbers = torch.rand(n)
    dist.broadcast(numbers.clone(), src=0)
    return numbers


def random_constant(n):
    return torch.zeros(n)


def random_mean_of_draws(n):
    numbers = torch.rand(n)
    dist.all_reduce(numbers)
    return numbers / dist.get_world_size()


def random_largest_draw(n):
    numbers = torch.rand(n)
    dist.all_reduce(numbers, op=dist.ReduceOp.MAX)
    return numbers


def random_normal_broadcast(n):
    numbers = torch.randn(n)
    dist.broadcast(numbers, src=0)
    return numbers


def random_from_last_rank(n):
    numbers = torch.rand(n)
    dist.broadcast(numbers, src=dist.get_world_size() - 1)
    return numbers


def random_second_draw_shared(n):
    torch.rand(n)  # e.g. a draw for something else first
    numbers = torch.rand(n)
    dist.broadcast(numbers, src=0)
    return numbers


def random_double_precision(n):
    numbers = torch.rand(n, dtype=torch.float64)
    dist.broadcast(numbers, src=0)
    return numbers


def random_global_seed(n):
    torch.manual_seed(31)
    return torch.rand(n)


@pytest.mark.parametrize("fn", ["solution", random_same_seed, random_from_last_rank,
                                random_second_draw_shared, random_global_seed,
                                random_double_precision])
def test_same_random_accepts(fn, capsys):
    fn = solution("00_welcome.ipynb", "same_random") if fn == "solution" else fn
    accepts(check_same_random, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (random_unsynced, "Each rank returned its own draw. No rank called a collective"),
    (random_broadcast_copy, "called broadcast, but on another tensor than the one it returned"),
    (random_summed, "called all_reduce, which adds the ranks' numbers"),
    (random_constant, "should be random draws"),
    (random_mean_of_draws, "the ranks agree, but on the average of their draws"),
    (random_largest_draw, "the ranks agree, but on the largest of their draws"),
    (random_normal_broadcast, "torch.randn draws from a normal distribution"),
])
def test_same_random_rejects(fn, hint, capsys):
    rejects(check_same_random, fn, hint, capsys)


# -- lesson 01: broadcast_parameters ---------------------------------------------------------

def broadcast_into_copy_back(model):
    with torch.no_grad():
        for p in model.parameters():
            received = p.detach().clone()
            dist.broadcast(received, src=0)
            p.copy_(received)


def broadcast_a_copy(model):
    for p in model.parameters():
        dist.broadcast(p.data.clone(), src=0)


def broadcast_average(model):
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= dist.get_world_size()


def broadcast_weights_only(model):
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            dist.broadcast(p.data, src=0)


def broadcast_from_last_rank(model):
    for p in model.parameters():
        dist.broadcast(p.data, src=dist.get_world_size() - 1)


def broadcast_state_dict(model):
    state = model.state_dict()  # tensors that share storage with the parameters
    for tensor in state.values():
        dist.broadcast(tensor, src=0)


def broadcast_from_rank1(model):
    for p in model.parameters():
        dist.broadcast(p.data, src=1)


def broadcast_nothing(model):
    torch.manual_seed(0)  # "the same seed everywhere" after the model was built changes nothing
    for p in model.parameters():
        p.grad = None


@pytest.mark.parametrize("fn", ["solution", broadcast_into_copy_back, broadcast_state_dict])
def test_broadcast_parameters_accepts(fn, capsys):
    if fn == "solution":
        fn = solution("01_ddp_from_scratch.ipynb", "broadcast_parameters")
    accepts(check_broadcast_parameters, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (broadcast_a_copy, "called broadcast 4 time(s), but on copies of the parameters"),
    (broadcast_nothing, "It called no broadcast"),
    (broadcast_average, "on the average of all ranks' weights"),
    (broadcast_weights_only, "fc1.bias, fc2.bias differ from rank 0's"),
    (broadcast_from_last_rank, "the ranks agree, but on rank 1's initial weights"),
    (broadcast_from_rank1, "with 2 ranks, the ranks agree, but on rank 1's initial weights"),
])
def test_broadcast_parameters_rejects(fn, hint, capsys):
    rejects(check_broadcast_parameters, fn, hint, capsys)


# -- lesson 01: average_gradients ------------------------------------------------------------

def average_flat(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def average_no_divide(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def average_first_only(model):
    p = next(model.parameters())
    dist.all_reduce(p.grad)
    p.grad /= dist.get_world_size()


def average_a_copy(model):
    for p in model.parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        g /= dist.get_world_size()


def average_divide_by_two(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2


def average_on_rank0_only(model):
    if dist.get_rank() == 0:
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def average_with_avg_op(model):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def average_divide_first(model):
    for p in model.parameters():
        p.grad /= dist.get_world_size()  # as DDP's own hook does: divide, then sum
        dist.all_reduce(p.grad)


def average_divide_by_three(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 3


def average_nothing(model):
    for p in model.parameters():
        p.grad /= dist.get_world_size()


@pytest.mark.parametrize("fn", ["solution", average_flat, average_with_avg_op,
                                average_divide_first])
def test_average_gradients_accepts(fn, capsys):
    if fn == "solution":
        fn = solution("01_ddp_from_scratch.ipynb", "average_gradients")
    accepts(check_average_gradients, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (average_no_divide, "is 2x the single-process gradient"),
    (average_first_only, "fc1.bias, fc2.weight, fc2.bias still hold the rank's own local"),
    (average_a_copy, "called all_reduce 4 time(s), but on copies of the gradients"),
    (average_divide_by_three, "with 2 ranks, rank 0's fc1.weight.grad is 0.667x"),
    (average_nothing, "changed but is not the average over ranks, and no all_reduce was called"),
    (average_divide_by_two, "not by a fixed number"),
    (average_on_rank0_only, "rank 0 failed inside a collective"),
])
def test_average_gradients_rejects(fn, hint, capsys):
    rejects(check_average_gradients, fn, hint, capsys)
