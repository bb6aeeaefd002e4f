"""Checks for lesson 03's exercises: a sharded, reshuffled training loader; an accuracy that
counts every sample once over all ranks; and a training loop that survives uneven data."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, close, on_ranks, run_check
from course_lib.checks.result import CheckResult

READ_WORLD_SIZES = (2, 3)
READ_SAMPLES, READ_EPOCHS, READ_BATCH = 24, 3, 4
EVAL_CASES = ((10, 4), (7, 3))  # (dataset size, world size): both pad with a sampler
UNEVEN_BATCHES = (3, 5)  # batches per rank in the uneven-data check
SEED = 4  # data on which every wrong answer below gives a different number


class IndexData(Dataset):
    """n samples (x, index); x is the index as a float, so every sample is distinct."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
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


def _read_on_rank(fn: Callable, n: int, epochs: int, batch_size: int) -> Any:
    return fn(IndexData(n), epochs, batch_size)


def check_read_epochs(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """On 2 and 3 ranks, fn(dataset, epochs, batch_size) must return the indices the rank
    read per epoch: shuffled, disjoint across ranks, covering the dataset, new every epoch."""
    def judge() -> str:
        for n in READ_WORLD_SIZES:
            results = on_ranks(_read_on_rank, fn, n, (READ_SAMPLES, READ_EPOCHS, READ_BATCH),
                               timeout, known=READ_ERRORS)
            _judge_reads([_indices(r, got, READ_EPOCHS) for r, got in enumerate(results)])
        return (f"on {' and '.join(map(str, READ_WORLD_SIZES))} ranks, every epoch split the "
                f"{READ_SAMPLES} samples between the ranks without overlap, shuffled, and "
                "differently each epoch.")
    return run_check("check_read_epochs", fn, judge)


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
        same = [e for e in range(1, READ_EPOCHS) if epochs[e] == epochs[e - 1]]
        if len(same) == READ_EPOCHS - 1:
            raise Rejected(f"rank {rank} read the same indices in the same order in all "
                           f"{READ_EPOCHS} epochs: call sampler.set_epoch(epoch) at the top of "
                           "every epoch.")
        if same:
            raise Rejected(f"rank {rank} read epochs {same[0] - 1} and {same[0]} in the same "
                           "order: call sampler.set_epoch(epoch) before iterating the loader, "
                           "with the epoch's own number.")


# -- global_accuracy(predict, dataset) -> float, the same on every rank ---------------------

class EvalData(Dataset):
    """n samples (x, y) with a fixed label; counts how often each sample is read here."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.y = (self.x.sum(dim=1) > 0).long()
        self.reads = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.x[i], self.y[i]


def predict(x: torch.Tensor) -> torch.Tensor:
    """The fixed classifier the check evaluates: it looks at the first feature only."""
    return (x[..., 0] > 0).long()


def _accuracy_on_rank(fn: Callable, n: int) -> tuple[Any, int]:
    data = EvalData(n)
    return fn(predict, data), data.reads


def _right(n: int) -> torch.Tensor:
    data = EvalData(n)
    return predict(data.x) == data.y


def check_global_accuracy(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(predict, dataset) on 4 ranks (10 samples) and 3 ranks (7 samples) must return, on
    every rank, the accuracy over the whole dataset, each sample counted once."""
    def judge() -> str:
        for n, world in EVAL_CASES:
            _judge_accuracy(on_ranks(_accuracy_on_rank, fn, world, (n,), timeout), n)
        cases = " and ".join(f"{w} ranks with {n} samples" for n, w in EVAL_CASES)
        return ("every rank returned the accuracy over the whole dataset (each sample "
                f"counted once), on {cases}.")
    return run_check("check_global_accuracy", fn, judge)


def _judge_accuracy(results: list[tuple[Any, int]], n: int) -> None:
    world, right = len(results), _right(n)
    want = right.float().mean().item()
    values = [_number(rank, got) for rank, (got, _) in enumerate(results)]
    reads = sum(r for _, r in results)  # 0 when DataLoader workers did the reading
    shards = [right[r::world].float().mean().item() for r in range(world)]
    if not all(close(v, values[0]) for v in values):
        mine = all(close(v, s) for v, s in zip(values, shards))
        why = " Each rank returned its own shard's accuracy." if mine else ""
        raise Rejected(f"with {world} ranks the ranks returned different accuracies "
                       f"{[round(v, 3) for v in values]}.{why} All-reduce the numbers of correct "
                       "answers and of samples, then divide.")
    got = values[0]
    if close(got, want):
        if reads >= n * world:
            raise Rejected(f"the accuracy is right, but each of the {world} ranks read all {n} "
                           "samples: the work was not split. Give each rank its own share.")
        return
    _explain_wrong_accuracy(got, want, right, shards, reads, world)


def _explain_wrong_accuracy(got: float, want: float, right: torch.Tensor, shards: list[float],
                            reads: int, world: int) -> None:
    n = len(right)
    padded_size, kept = math.ceil(n / world) * world, (n // world) * world
    if reads:  # how many samples the ranks read tells padding and dropping apart
        padded, dropped = reads == padded_size, reads == kept
    else:  # DataLoader workers read them: compare with the unshuffled sampler's numbers
        padded = close(got, torch.cat([right, right[: padded_size - n]]).float().mean().item())
        dropped = close(got, right[:kept].float().mean().item())
    if padded:
        raise Rejected(f"you returned {got:.3f}, an accuracy over {padded_size} samples for a "
                       f"dataset of {n} (true: {want:.3f}): DistributedSampler pads every shard "
                       "by repeating samples, so some count twice. Evaluate unpadded shards, "
                       "e.g. Subset(dataset, range(rank, len(dataset), world_size)).")
    if dropped:
        raise Rejected(f"you returned {got:.3f}, an accuracy over {kept} of the {n} samples "
                       f"(true: {want:.3f}): drop_last=True leaves samples out. Every sample "
                       "must count once.")
    if close(got, sum(shards) / world):
        raise Rejected(f"you returned {got:.3f}, the mean of the ranks' accuracies (true: "
                       f"{want:.3f}): the shards have different sizes, so the mean of ratios is "
                       "not the ratio of sums. All-reduce correct and total, then divide.")
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


# -- train_uneven(ddp_model, batches, optimizer) ---------------------------------------------

class CountedBatches:
    """The rank's batches; counts how many the training loop took."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.batches, self.taken = batches, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.batches:
            self.taken += 1
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def _train_on_rank(fn: Callable, counts: tuple[int, ...]) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = nn.Linear(4, 1)
    start = [p.detach().clone() for p in model.parameters()]
    ddp_model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    torch.manual_seed(SEED + rank)
    batches = CountedBatches([(torch.randn(8, 4), torch.randn(8, 1))
                              for _ in range(counts[rank])])
    fn(ddp_model, batches, optimizer)
    moved = any(not torch.equal(a, p) for a, p in zip(start, model.parameters()))
    return {"taken": batches.taken, "params": [p.detach().clone() for p in model.parameters()],
            "moved": moved}


def check_train_uneven(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(ddp_model, batches, optimizer) on 2 ranks with 3 and 5 batches must train on every
    batch of every rank, finish on every rank, and leave the ranks with equal weights."""
    def judge() -> str:
        try:
            results = on_ranks(_train_on_rank, fn, len(UNEVEN_BATCHES), (UNEVEN_BATCHES,),
                               timeout)
        except Rejected as rejected:
            failure = rejected.failure
            if failure is None or not (failure.timed_out or failure.consequence):
                raise
            raise Rejected(failure.explained(
                f"the ranks did not all finish: rank 0 ran out after {UNEVEN_BATCHES[0]} "
                f"batches while rank 1, with {UNEVEN_BATCHES[1]}, waited in its next "
                "backward's all-reduce for a rank that had moved on. Wrap the loop in "
                "Join([ddp_model])."), failure) from None
        _judge_training(results)
        return (f"ranks with {' and '.join(map(str, UNEVEN_BATCHES))} batches trained on all "
                "of them, finished together, and ended with the same weights.")
    return run_check("check_train_uneven", fn, judge)


def _judge_training(results: list[dict]) -> None:
    for rank, got in enumerate(results):
        if got["taken"] < UNEVEN_BATCHES[rank]:
            raise Rejected(f"rank {rank} trained on {got['taken']} of its {UNEVEN_BATCHES[rank]} "
                           "batches: every rank must use all of its own data. Join([ddp_model]) "
                           "lets the ranks with fewer batches finish first.")
    if not all(got["moved"] for got in results):
        raise Rejected("the weights did not change: call loss.backward() and "
                       "optimizer.step() for each batch.")
    first = results[0]["params"]
    for rank, got in enumerate(results[1:], start=1):
        if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                   for a, b in zip(first, got["params"])):
            raise Rejected(f"after training, rank {rank}'s weights differ from rank 0's: some "
                           "steps were not averaged over the ranks (a no_sync(), or training "
                           "outside DDP?). Let DDP all-reduce every step, inside Join.")
