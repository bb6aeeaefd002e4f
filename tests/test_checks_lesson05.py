"""Lesson 05's checks accept the worked solutions and differently written correct answers, and
reject plausible wrong answers, each with the hint that names what went wrong."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from verdicts import ACCEPTED, Solution, cases, verdicts_for

from course_lib.checks.lesson05 import check_evaluate, check_global_batch_stats

NOTEBOOK = "05_batchnorm_and_buffers.ipynb"
FAST = 6  # seconds: wrong answers that desynchronise ranks fail fast, never wait this long
EVAL_TIMEOUT = 20  # the evaluate check trains a DDP model first; its hangs end after 2 s


judged = verdicts_for(NOTEBOOK, FAST)
judged_slowly = verdicts_for(NOTEBOOK, EVAL_TIMEOUT)


# -- global_batch_stats -----------------------------------------------------------------------

def stats_by_gather(x):
    """Gather every rank's rows (sizes differ: pad to the largest), then compute directly."""
    n = torch.tensor([len(x)])
    sizes = [torch.zeros(1, dtype=n.dtype) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    longest = int(max(sizes))
    padded = torch.zeros(longest, x.shape[1])
    padded[:len(x)] = x
    everyone = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(everyone, padded)
    rows = torch.cat([rows[:int(k)] for rows, k in zip(everyone, sizes)])
    return rows.mean(0), rows.var(0, unbiased=False)


def stats_local(x):
    return x.mean(0), x.var(0, unbiased=False)


def stats_average_of_means(x):
    mean, var = x.mean(0), x.var(0, unbiased=False)
    dist.all_reduce(mean)
    dist.all_reduce(var)
    n = dist.get_world_size()
    return mean / n, var / n


def stats_average_of_variances(x):
    totals = torch.cat([x.sum(0), torch.tensor([float(len(x))])])
    dist.all_reduce(totals)
    mean = totals[:-1] / totals[-1]
    var = ((x - x.mean(0)) ** 2).sum(0)  # each rank's spread around its own mean
    dist.all_reduce(var)
    return mean, var / totals[-1]


def stats_gathered_like_torch(x):
    """As nn.SyncBatchNorm does: gather every rank's (mean, var, count), combine by count."""
    c = x.shape[1]
    mine = torch.cat([x.mean(0), x.var(0, unbiased=False), torch.tensor([float(len(x))])])
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    means, variances, counts = torch.stack(everyone).split([c, c, 1], dim=1)
    mean = (counts * means).sum(0) / counts.sum()
    return mean, (counts * (variances + (means - mean) ** 2)).sum(0) / counts.sum()


def stats_gathered_from_two_ranks(x):
    """Right on 2 ranks only: the gather list has room for two."""
    c = x.shape[1]
    mine = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))])])
    both = [torch.empty_like(mine), torch.empty_like(mine)]
    dist.all_gather(both, mine)
    totals = both[0] + both[1]
    mean = totals[:c] / totals[-1]
    return mean, totals[c:2 * c] / totals[-1] - mean * mean


def stats_reduced_temporaries(x):
    """all_reduce on temporaries: the reduced sums are thrown away."""
    dist.all_reduce(x.sum(0))
    dist.all_reduce((x * x).sum(0))
    return x.mean(0), x.var(0, unbiased=False)


def stats_count_times_world_size(x):
    """Assumes every rank holds as many rows as this one."""
    sums = torch.cat([x.sum(0), (x * x).sum(0)]).double()
    dist.all_reduce(sums)
    c, n = x.shape[1], len(x) * dist.get_world_size()
    mean = sums[:c] / n
    return mean, sums[c:] / n - mean * mean


def stats_unbiased(x):
    totals = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))])]).double()
    dist.all_reduce(totals)
    c, n = x.shape[1], totals[-1]
    mean = totals[:c] / n
    return mean, (totals[c:2 * c] - n * mean * mean) / (n - 1)


def stats_on_rank0_only(x):
    totals = torch.cat([x.sum(0), (x * x).sum(0), torch.tensor([float(len(x))])]).double()
    dist.reduce(totals, dst=0)
    c, n = x.shape[1], totals[-1]
    mean = totals[:c] / n
    return mean, totals[c:2 * c] / n - mean * mean


# (answer, the hint the check's message must hold; ACCEPTED: the check passes the answer)
GLOBAL_BATCH_STATS = [
    (Solution("global_batch_stats"), ACCEPTED),
    (stats_by_gather, ACCEPTED),
    (stats_gathered_like_torch, ACCEPTED),
    (stats_local, "on 2 ranks holding 6 and 3 rows, rank 0 returned the statistics of its "
                  "own 6 rows only, and called no collective"),
    (stats_reduced_temporaries, "although it called all_reduce: the combined result was not"),
    (stats_count_times_world_size, "divided by 12 (its own 6 rows times 2 ranks)"),
    (stats_gathered_from_two_ranks, "right on 2 ranks, wrong on 4"),
    (stats_average_of_means, "the plain average of the ranks' own means"),
    (stats_average_of_variances, "misses how far apart their means are"),
    (stats_unbiased, "the unbiased one (divided by N - 1)"),
    (stats_on_rank0_only, "only rank 0 got the global statistics"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_global_batch_stats,
                                                      GLOBAL_BATCH_STATS))
def test_the_stats_check_judges_the_answer(check, answer, hint, capsys):
    """A right answer passes; a wrong one fails with the hint that names its mistake."""
    judged(check, answer, hint, capsys)


# -- evaluate ---------------------------------------------------------------------------------

def evaluate_keeping_the_mode(model, x, y):
    net = model.module
    was_training = net.training
    net.eval()
    with torch.inference_mode():
        correct = (net(x).argmax(dim=1) == y).sum()
    net.train(was_training)
    return correct / len(y)  # a one-element tensor is accepted too


def evaluate_a_copy(model, x, y):
    """A copy of the trained network, in eval mode: the model itself is never touched."""
    net = copy.deepcopy(model.module).eval()
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def evaluate_a_rebuilt_network(model, x, y):
    """The same architecture, rebuilt and loaded with the trained weights: correct too."""
    net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    net.load_state_dict(model.module.state_dict())
    net.eval()
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def evaluate_a_fresh_network(model, x, y):
    """A new, untrained network of the same shape: not the model it was given."""
    net = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    net.eval()
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def evaluate_a_copy_in_training_mode(model, x, y):
    """A copy keeps the model's statistics, but BatchNorm still uses the batch's own."""
    net = copy.deepcopy(model.module)
    with torch.no_grad():
        return (net(x).argmax(1) == y).float().mean().item()


def evaluate_in_percent(model, x, y):
    net = model.module.eval()
    with torch.no_grad():
        accuracy = 100 * (net(x).argmax(1) == y).float().mean().item()
    net.train()
    return accuracy


def evaluate_through_the_wrapper(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return accuracy


def evaluate_in_training_mode(model, x, y):
    with torch.no_grad():
        return (model.module(x).argmax(1) == y).float().mean().item()


def evaluate_left_in_eval_mode(model, x, y):
    model.module.eval()
    with torch.no_grad():
        return (model.module(x).argmax(1) == y).float().mean().item()


def evaluate_counting_correct(model, x, y):
    net = model.module.eval()
    with torch.no_grad():
        correct = (net(x).argmax(1) == y).sum().item()
    net.train()
    return correct


EVALUATE = [
    (Solution("evaluate"), ACCEPTED),
    (evaluate_keeping_the_mode, ACCEPTED),
    (evaluate_a_copy, ACCEPTED),
    (evaluate_a_rebuilt_network, ACCEPTED),
    (evaluate_through_the_wrapper, "started a broadcast of the BatchNorm buffers"),
    (evaluate_in_training_mode, "BatchNorm ran in training mode (1 of its 1 forwards)"),
    (evaluate_left_in_eval_mode, "on 2 ranks (rank 0 evaluating, the others waiting): after "
                                 "evaluate() the model is still in eval mode"),
    (evaluate_counting_correct, "the number of correct rows: divide by the number of rows (64)"),
    (evaluate_in_percent, "a percentage"),
    (evaluate_a_fresh_network, "without running the model it was given"),
    (evaluate_a_copy_in_training_mode, "the accuracy with BatchNorm in training mode (the given "
                                       "model's BatchNorm ran 1 forward(s) in training mode)"),
]


@pytest.mark.parametrize("check, answer, hint", cases(check_evaluate, EVALUATE))
def test_the_evaluate_check_judges_the_answer(check, answer, hint, capsys):
    """As above, with the longer limit of a check that trains a DDP model first."""
    judged_slowly(check, answer, hint, capsys)
