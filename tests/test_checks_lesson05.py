"""Lesson 05's checks accept the worked solutions and differently written correct answers, and
reject plausible wrong answers, each with the hint that names what went wrong."""


import pytest
import torch
import torch.distributed as dist
from checking import check_helpers

from course_lib.checks.lesson05 import check_evaluate, check_global_batch_stats

NOTEBOOK = "05_batchnorm_and_buffers.ipynb"
FAST = 6  # seconds: wrong answers that desynchronise ranks fail fast, never wait this long
EVAL_TIMEOUT = 20  # the evaluate check trains a DDP model first; its hangs end after 2 s


solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)



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


@pytest.mark.parametrize("fn", ["solution", stats_by_gather])
def test_global_batch_stats_accepts(fn, capsys):
    fn = solution("global_batch_stats") if fn == "solution" else fn
    accepts(check_global_batch_stats, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (stats_local, "returned the statistics of its own 2 rows"),
    (stats_average_of_means, "the plain average of the ranks' own means"),
    (stats_average_of_variances, "misses how far apart their means are"),
    (stats_unbiased, "the unbiased one (divided by N - 1)"),
    (stats_on_rank0_only, "only rank 0 got the global statistics"),
])
def test_global_batch_stats_rejects(fn, hint, capsys):
    rejects(check_global_batch_stats, fn, hint, capsys)


# -- evaluate ---------------------------------------------------------------------------------

def evaluate_keeping_the_mode(model, x, y):
    net = model.module
    was_training = net.training
    net.eval()
    with torch.inference_mode():
        correct = (net(x).argmax(dim=1) == y).sum()
    net.train(was_training)
    return correct / len(y)  # a one-element tensor is accepted too


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


@pytest.mark.parametrize("fn", ["solution", evaluate_keeping_the_mode])
def test_evaluate_accepts(fn, capsys):
    fn = solution("evaluate") if fn == "solution" else fn
    accepts(check_evaluate, fn, capsys, timeout=EVAL_TIMEOUT)


@pytest.mark.parametrize("fn, hint", [
    (evaluate_through_the_wrapper, "started a broadcast of the BatchNorm buffers"),
    (evaluate_in_training_mode, "changed BatchNorm's running statistics"),
    (evaluate_left_in_eval_mode, "still in eval mode"),
    (evaluate_counting_correct, "compute the share of rows"),
])
def test_evaluate_rejects(fn, hint, capsys):
    rejects(check_evaluate, fn, hint, capsys, timeout=EVAL_TIMEOUT)
