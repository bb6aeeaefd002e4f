"""Check for lesson 03's first exercise: read_epochs(dataset, epochs, batch_size) returns the
indices the rank read per epoch, and they must be shuffled, disjoint across ranks, cover the
dataset and change every epoch. Reads are counted by the dataset itself (`counted_reads`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import Dataset

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, at_world_sizes, check
from course_lib.checks.lesson03.counted_reads import CountedReads, platform_start_method
from course_lib.words import listing

READ_WORLD_SIZES = (2, 3)
READ_SAMPLES, READ_EPOCHS, READ_BATCH = 24, 3, 4


class IndexData(CountedReads, Dataset):
    """n samples (x, index); x is the index as a float, so every sample is distinct."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.count(i)
        return torch.tensor([float(i)]), i



def _indices(rank: int, got: Any, epochs: int) -> list[list[int]]:
    try:
        lists = [[int(i) for i in epoch] for epoch in got]
    except (TypeError, ValueError):
        raise Rejected(f"rank {rank} returned {str(got)[:60]!r}; return one list of indices "
                       "per epoch.") from None
    if len(lists) != epochs:
        raise Rejected(f"rank {rank} returned {len(lists)} lists for {epochs} epochs; return "
                       "one list of indices per epoch.")
    return lists


# -- read_epochs(dataset, epochs, batch_size) -> list of index lists ------------------------

# (fragment of PyTorch's error, hint): DataLoader's ValueError for a sampler with shuffle=True.
READ_ERRORS = (
    ("mutually exclusive with shuffle",
     "DataLoader refused to be built: 'sampler option is mutually exclusive with shuffle'. "
     "The DistributedSampler shuffles; leave shuffle out of the DataLoader."),
)


def _read_on_rank(fn: Callable, n: int, epochs: int, batch_size: int) -> tuple[Any, list[int]]:
    platform_start_method()
    data = IndexData(n)
    return fn(data, epochs, batch_size), data.read_counts()


@check
def check_read_epochs(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """On 2 and 3 ranks, fn(dataset, epochs, batch_size) must return the indices the rank
    read per epoch: shuffled, disjoint across ranks, covering the dataset, new every epoch."""
    for _, results in at_world_sizes(_read_on_rank, fn, READ_WORLD_SIZES,
                                     (READ_SAMPLES, READ_EPOCHS, READ_BATCH), timeout,
                                     known=READ_ERRORS):
        reads = [_indices(r, got, READ_EPOCHS) for r, (got, _) in enumerate(results)]
        _judge_reads(reads)
        _judge_counted(reads, [counts for _, counts in results])
    return (f"on {listing(READ_WORLD_SIZES)} ranks, every epoch split the {READ_SAMPLES} "
            "samples between the ranks without overlap, shuffled, and differently each "
            "epoch (reads counted in the dataset, DataLoader workers included).")


def _judge_reads(reads: list[list[list[int]]]) -> None:
    n, world = READ_SAMPLES, len(reads)
    for epoch in range(READ_EPOCHS):
        per_rank = [reads[r][epoch] for r in range(world)]
        if all(sorted(p) == list(range(n)) for p in per_rank):
            raise Rejected(f"with {world} ranks, every rank read all {n} samples in epoch "
                           f"{epoch}: nothing splits the data. Give the DataLoader a "
                           "DistributedSampler.")
        counts = Counter(i for p in per_rank for i in p)
        if twice := sorted(i for i, c in counts.items() if c > 1):
            raise Rejected(f"with {world} ranks, indices {twice[:6]} were read more than once "
                           f"in epoch {epoch}: the ranks' shards overlap. Use one "
                           "DistributedSampler, which splits one shared shuffle.")
        if missing := sorted(set(range(n)) - set(counts)):
            raise Rejected(f"with {world} ranks, indices {missing[:6]} were not read in epoch "
                           f"{epoch}: every sample must be read by some rank.")
    for rank, epochs in enumerate(reads):
        if all(e == sorted(e) for e in epochs):
            raise Rejected(f"rank {rank} read its indices in increasing order in every epoch: "
                           "nothing shuffles. DistributedSampler(dataset, shuffle=True).")
    for rank, epochs in enumerate(reads):
        same_order = [e for e in range(1, READ_EPOCHS) if epochs[e] == epochs[e - 1]]
        if len(same_order) == READ_EPOCHS - 1:
            raise Rejected(f"rank {rank} read the same indices in the same order in all "
                           f"{READ_EPOCHS} epochs: call sampler.set_epoch(epoch) at the top of "
                           "every epoch.")
        if same_order:
            raise Rejected(f"rank {rank} read epochs {same_order[0] - 1} and {same_order[0]} in "
                           "the same order: call sampler.set_epoch(epoch) before iterating the "
                           "loader, with the epoch's own number.")
        if all(sorted(e) == sorted(epochs[0]) for e in epochs):
            raise Rejected(f"with {world} ranks, rank {rank} read the same {len(epochs[0])} "
                           f"samples in all {READ_EPOCHS} epochs, only in another order: the "
                           "split between the ranks never changes. Shuffle the whole dataset "
                           "with one seed shared by the ranks, new each epoch, then split it: "
                           "DistributedSampler does that, with set_epoch(epoch).")


def _judge_counted(reads: list[list[list[int]]], counted: list[list[int]]) -> None:
    """The indices each rank returned must be those its dataset was asked for."""
    if not any(any(c) for c in counted):
        return  # nothing went through __getitem__: the returned indices are all we have
    for rank, (epochs, counts) in enumerate(zip(reads, counted)):
        returned = Counter(i for e in epochs for i in e)
        read = Counter({i: c for i, c in enumerate(counts) if c})
        if returned == read:
            continue
        everything = all(c >= READ_EPOCHS for c in counts)
        how = (f"read every one of the {READ_SAMPLES} samples each epoch" if everything else
               f"read {sum(counts)} samples over the {READ_EPOCHS} epochs")
        raise Rejected(f"with {len(reads)} ranks, rank {rank} returned {returned.total()} "
                       f"indices but its DataLoader {how} (counted in the dataset, "
                       "DataLoader workers included). Return the indices of the batches the "
                       "loader gave you, from a DataLoader built with the DistributedSampler.")
