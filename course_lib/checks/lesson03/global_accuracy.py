"""Check for lesson 03's second exercise: global_accuracy(predict, dataset) returns one
accuracy, the same on every rank, that counts every sample of the dataset once, although the
DistributedSampler pads the ranks' shares. Reads are counted by the dataset (`counted_reads`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check, close
from course_lib.checks.lesson03.counted_reads import SEED, CountedReads, platform_start_method

EVAL_CASES = ((10, 4), (7, 3))  # (dataset size, world size): both pad with a sampler


class EvalData(CountedReads, Dataset):
    """n samples (x, y) with a fixed label; counts how often each sample is read."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        super().__init__(n)
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.count(i)
        return self.x[i], self.y[i]


def predict(x: torch.Tensor) -> torch.Tensor:
    """The fixed classifier the check evaluates: it looks at the first feature only."""
    return (x[..., 0] > 0).long()


def _accuracy_on_rank(fn: Callable, n: int) -> tuple[Any, list[int]]:
    platform_start_method()
    data = EvalData(n)
    return fn(predict, data), data.read_counts()


def _right(n: int) -> torch.Tensor:
    data = EvalData(n)
    return predict(data.x) == data.y


@check
def check_global_accuracy(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(predict, dataset) on 4 ranks (10 samples) and 3 ranks (7 samples) must return, on
    every rank, the accuracy over the whole dataset, each sample counted once."""
    sizes = dict((world, n) for n, world in EVAL_CASES)

    for world, results in at_world_sizes(_accuracy_on_rank, fn, tuple(sizes),
                                          lambda w: (sizes[w],), timeout):
        _judge_accuracy(results, sizes[world])
    cases = " and ".join(f"{w} ranks with {n} samples" for n, w in EVAL_CASES)
    return ("every rank returned the accuracy over the whole dataset (each sample "
            f"counted once), on {cases}.")


def _accuracy_of(counts: torch.Tensor, right: torch.Tensor) -> float | None:
    """The accuracy over the samples read, each as often as it was read (None: none read)."""
    total = int(counts.sum())
    return None if total == 0 else float((counts * right).sum()) / total


def _judge_accuracy(results: list[tuple[Any, list[int]]], n: int) -> None:
    world, right = len(results), _right(n)
    want = right.float().mean().item()
    values = [_number(rank, got) for rank, (got, _) in enumerate(results)]
    counts = torch.tensor([c for _, c in results])  # (rank, index): reads, workers included
    own = [_accuracy_of(c, right) for c in counts]
    if not all(close(v, values[0]) for v in values):
        mine = all(a is not None and close(v, a) for v, a in zip(values, own))
        why = (" Each rank returned the accuracy of the samples it read itself: nothing "
               "combined the ranks' counts (all_reduce changes the tensor you pass it, in "
               "place: use that tensor afterwards)." if mine else "")
        raise Rejected(f"with {world} ranks the ranks returned different accuracies "
                       f"{[round(v, 3) for v in values]}.{why} All-reduce the numbers of correct "
                       "answers and of samples, then divide.")
    got = values[0]
    if close(got, want):
        if bool((counts > 0).all()):
            raise Rejected(f"the accuracy is right, but each of the {world} ranks read all {n} "
                           "samples (counted in the dataset, DataLoader workers included): "
                           "the work was not split. Give each rank its own share.")
        return
    if counts.sum() > 0:
        _explain_from_reads(got, want, right, counts, own)
    _explain_from_value(got, want, right, world)


def _explain_from_reads(got: float, want: float, right: torch.Tensor, counts: torch.Tensor,
                        own: list[float | None]) -> None:
    """Name the mistake from which samples each rank read (when the dataset saw the reads)."""
    n, world, per_index = len(right), len(counts), counts.sum(dim=0)
    if close(got, _accuracy_of(per_index, right)):
        twice = [i for i, c in enumerate(per_index.tolist()) if c > 1]
        never = [i for i, c in enumerate(per_index.tolist()) if c == 0]
        if twice:
            raise Rejected(f"you returned {got:.3f}, an accuracy over {int(per_index.sum())} "
                           f"reads for a dataset of {n} (true: {want:.3f}): indices {twice} "
                           f"were evaluated on more than one of the {world} ranks. "
                           "DistributedSampler pads every shard by repeating samples; evaluate "
                           "unpadded shards, e.g. Subset(dataset, range(rank, len(dataset), "
                           "world_size)).")
        if never:
            raise Rejected(f"you returned {got:.3f}, an accuracy over {n - len(never)} of the "
                           f"{n} samples (true: {want:.3f}): indices {never} were never "
                           "evaluated (drop_last=True leaves samples out). Every sample must "
                           "count once.")
    read = [a for a in own if a is not None]
    if close(got, sum(read) / len(read)):
        sizes = [int(c.sum()) for c in counts]
        raise Rejected(f"you returned {got:.3f}, the mean of the ranks' own accuracies "
                       f"(true: {want:.3f}): the ranks read {sizes} samples, so the mean of "
                       "their ratios is not the ratio of the sums. All-reduce correct and "
                       "total, then divide.")


def _explain_from_value(got: float, want: float, right: torch.Tensor, world: int) -> None:
    """Name the mistake from the value alone (the reads did not go through the dataset)."""
    n, per_rank = len(right), -(-len(right) // world)
    strided = [right[r::world] for r in range(world)]
    contiguous = [right[r * per_rank:(r + 1) * per_rank] for r in range(world)]
    for layout in (strided, [s for s in contiguous if len(s)]):
        if close(got, sum(s.float().mean().item() for s in layout) / len(layout)):
            raise Rejected(f"you returned {got:.3f}, the mean of the ranks' accuracies (true: "
                           f"{want:.3f}): the shards have different sizes, so the mean of "
                           "ratios is not the ratio of sums. All-reduce correct and total, "
                           "then divide.")
    if got > 1:
        raise Rejected(f"you returned {got:.3f}, more than 1: the ranks' accuracies were added "
                       "up. All-reduce the counts (correct, total), then divide.")
    raise Rejected(f"with {world} ranks and {n} samples every rank returned {got:.3f}; the "
                   f"accuracy over the dataset is {want:.3f}.")


def _number(rank: int, got: Any) -> float:
    try:
        return float(got)
    except (TypeError, ValueError, RuntimeError):
        raise Rejected(f"rank {rank} returned {str(got)[:60]!r}; return the accuracy as a "
                       "number.") from None
