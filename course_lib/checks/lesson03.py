"""Checks for lesson 03's exercises: a sharded, reshuffled training loader; an accuracy that
counts every sample once over all ranks; and a training loop that survives uneven data.

Reads are counted by the datasets themselves, in shared memory, so that samples read in
DataLoader worker processes count as well as those read in the rank's own process."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    Failure,
    Rejected,
    at_world_sizes,
    close,
    listing,
    run_check,
    same,
    state_snapshot,
)
from course_lib.checks.result import CheckResult
from course_lib.telemetry import Recorder

READ_WORLD_SIZES = (2, 3)
READ_SAMPLES, READ_EPOCHS, READ_BATCH = 24, 3, 4
EVAL_CASES = ((10, 4), (7, 3))  # (dataset size, world size): both pad with a sampler
UNEVEN_BATCHES = ((3, 5), (4, 2, 5))  # batches per rank, at 2 and at 3 ranks
# A rank left waiting in a collective fails after this (or half the check's limit, if less),
# while its records still come back: the hint then says how far each rank got.
UNEVEN_PG_TIMEOUT = 10.0
LR = 0.1
SEED = 4  # data on which every wrong answer below gives a different number


class CountedReads:
    """Per-index read counts in shared memory: DataLoader workers (forked or spawned) add to
    the same counts as the rank's own process."""

    def __init__(self, n: int) -> None:
        self.reads = torch.zeros(n, dtype=torch.int64).share_memory_()

    def count(self, i: int) -> None:
        self.reads[i] += 1

    def read_counts(self) -> list[int]:
        return self.reads.tolist()


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


def _platform_start_method() -> None:
    """Start DataLoader workers as a torchrun rank would (fork on Linux, spawn on macOS).

    A rank started by the launcher's forkserver inherits "forkserver" as its default, and
    every DataLoader(num_workers=2) would then start a forkserver of its own, which imports
    torch: 15 s per pass over the data on a loaded 2-core machine, against 0.3-0.6 s."""
    multiprocessing.set_start_method(None, force=True)


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
    _platform_start_method()
    data = IndexData(n)
    return fn(data, epochs, batch_size), data.read_counts()


def check_read_epochs(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """On 2 and 3 ranks, fn(dataset, epochs, batch_size) must return the indices the rank
    read per epoch: shuffled, disjoint across ranks, covering the dataset, new every epoch."""
    def judge() -> str:
        for _, results in at_world_sizes(_read_on_rank, fn, READ_WORLD_SIZES,
                                         (READ_SAMPLES, READ_EPOCHS, READ_BATCH), timeout,
                                         known=READ_ERRORS):
            reads = [_indices(r, got, READ_EPOCHS) for r, (got, _) in enumerate(results)]
            _judge_reads(reads)
            _judge_counted(reads, [counts for _, counts in results])
        return (f"on {listing(READ_WORLD_SIZES)} ranks, every epoch split the {READ_SAMPLES} "
                "samples between the ranks without overlap, shuffled, and differently each "
                "epoch (reads counted in the dataset, DataLoader workers included).")
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


# -- global_accuracy(predict, dataset) -> float, the same on every rank ---------------------

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
    _platform_start_method()
    data = EvalData(n)
    return fn(predict, data), data.read_counts()


def _right(n: int) -> torch.Tensor:
    data = EvalData(n)
    return predict(data.x) == data.y


def check_global_accuracy(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(predict, dataset) on 4 ranks (10 samples) and 3 ranks (7 samples) must return, on
    every rank, the accuracy over the whole dataset, each sample counted once."""
    sizes = dict((world, n) for n, world in EVAL_CASES)

    def judge() -> str:
        for world, results in at_world_sizes(_accuracy_on_rank, fn, tuple(sizes),
                                              lambda w: (sizes[w],), timeout):
            _judge_accuracy(results, sizes[world])
        cases = " and ".join(f"{w} ranks with {n} samples" for n, w in EVAL_CASES)
        return ("every rank returned the accuracy over the whole dataset (each sample "
                f"counted once), on {cases}.")
    return run_check("check_global_accuracy", fn, judge)


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


# -- train_uneven(ddp_model, batches, optimizer) ---------------------------------------------

Batch = tuple[torch.Tensor, torch.Tensor]


class CountedBatches:
    """The rank's batches; records how many the training loop took, even if it then hangs."""

    def __init__(self, batches: list[Batch], rec: Recorder) -> None:
        self.batches, self.taken, self.rec = batches, 0, rec

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.batches:
            self.taken += 1
            self.rec.scalar("taken", self.taken, step=self.taken)
            yield batch

    def __len__(self) -> int:
        return len(self.batches)


def _train_on_rank(fn: Callable, counts: tuple[int, ...]) -> dict:
    rank = dist.get_rank()
    torch.manual_seed(SEED)
    model = nn.Linear(4, 1)
    start = state_snapshot(model)
    ddp_model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    torch.manual_seed(SEED + rank)
    batches = CountedBatches([(torch.randn(8, 4), torch.randn(8, 1))
                              for _ in range(counts[rank])], Recorder())
    fn(ddp_model, batches, optimizer)
    return {"taken": batches.taken, "state": state_snapshot(model), "start": start,
            "batches": batches.batches}


def check_train_uneven(fn: Callable, timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """fn(ddp_model, batches, optimizer) on 2 ranks (3 and 5 batches) and 3 ranks (4, 2 and 5)
    must train on every batch of every rank, finish on every rank, and end with the weights
    that averaged steps over all the ranks' batches give."""
    by_size = {len(c): c for c in UNEVEN_BATCHES}

    def judge() -> str:
        try:
            for _, results in at_world_sizes(_train_on_rank, fn, tuple(by_size),
                                             lambda n: (by_size[n],), timeout,
                                             pg_timeout=min(UNEVEN_PG_TIMEOUT, timeout / 2)):
                _judge_training(results)
        except Rejected as rejected:
            _explain_hang(rejected, by_size)
            raise
        cases = " and ".join(f"{listing(c)} batches" for c in UNEVEN_BATCHES)
        return (f"ranks with {cases} trained on all of them, finished together, and ended "
                "with the weights of averaged steps over every rank's batches.")
    return run_check("check_train_uneven", fn, judge)


def _explain_hang(rejected: Rejected, by_size: dict[int, tuple[int, ...]]) -> None:
    """Re-raise a hang (a rank left waiting in a collective) with what each rank took."""
    failure: Failure | None = rejected.failure
    if failure is None or not (failure.timed_out or failure.consequence
                               or "Timed out" in failure.message):
        return
    counts = by_size[failure.world_size]
    taken = _taken_before_failure(failure)
    if taken is None:
        story = (f"with {listing(counts)} batches on the {len(counts)} ranks, a rank that ran "
                 "out of batches moved on while another waited in its next backward's "
                 "all-reduce.")
    else:
        done = [r for r, (t, n) in enumerate(zip(taken, counts)) if t >= n]
        busy = [r for r, (t, n) in enumerate(zip(taken, counts)) if t < n]
        story = ("; ".join(f"rank {r} took {t} of its {n} batches"
                           for r, (t, n) in enumerate(zip(taken, counts)))
                 + (f": rank {listing(done)} ran out and moved on while rank {listing(busy)} "
                    "waited in an all-reduce of DDP's backward that the others never joined."
                    if done and busy else "."))
    raise Rejected(failure.explained(f"the ranks did not all finish: {story} Wrap the loop in "
                                     "Join([ddp_model])."), failure) from None


def _taken_before_failure(failure: Failure) -> list[int] | None:
    """How many batches each rank took before the launch failed, from its records."""
    run = getattr(failure.error, "run", None)
    if run is None:
        return None
    table = run.telemetry.scalars
    if sorted(run.telemetry.ranks) != list(range(failure.world_size)):
        return None
    return [int(table.where(rank=r, name="taken")["value"].max(initial=0))
            for r in range(failure.world_size)]


def _judge_training(results: list[dict]) -> None:
    world = len(results)
    counts = [len(got["batches"]) for got in results]
    for rank, got in enumerate(results):
        if got["taken"] < counts[rank]:
            raise Rejected(f"with {world} ranks, rank {rank} trained on {got['taken']} of its "
                           f"{counts[rank]} batches: every rank must use all of its own data. "
                           "Join([ddp_model]) lets the ranks with fewer batches finish first.")
    start, states = results[0]["start"], [got["state"] for got in results]
    if all(all(same(s[k], v) for k, v in start.items()) for s in states):
        raise Rejected("the weights did not change: call loss.backward() and "
                       "optimizer.step() for each batch.")
    for rank, state in enumerate(states[1:], start=1):
        if not all(same(state[k], v) for k, v in states[0].items()):
            raise Rejected(f"with {world} ranks, after training rank {rank}'s weights differ "
                           "from rank 0's: some steps were not averaged over the ranks (a "
                           "no_sync(), or training outside DDP?). Let DDP all-reduce every "
                           "step, inside Join.")
    _compare_with_true(states[0], start, [got["batches"] for got in results])


def _compare_with_true(got: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
                       batches: list[list[Batch]]) -> None:
    """The ranks agree; their weights must be those of averaged steps over all batches."""
    world, fewest = len(batches), min(len(b) for b in batches)
    matches = lambda want: all(same(got[k], w) for k, w in want.items())  # noqa: E731
    if matches(_trained(start, batches)) or matches(_trained(start, batches, by_active=True)):
        return
    if matches(_trained(start, batches, steps=fewest)):
        raise Rejected(f"with {world} ranks, every rank read all of its batches, but the "
                       f"weights are those of training on the first {fewest} batches of each "
                       "rank only: the longer ranks' extra batches were never trained on. "
                       "Train on every batch inside Join([ddp_model]).")
    for rank, own in enumerate(batches):
        if matches(_trained(start, [own])):
            raise Rejected(f"with {world} ranks, every rank ended with the weights that rank "
                           f"{rank} gets by training alone on its own batches: the ranks' "
                           "gradients were never averaged (training on ddp_model.module, or "
                           f"under no_sync(), then copying rank {rank}'s weights?). Train the "
                           "DDP model itself, inside Join([ddp_model]).")
    gap = max((got[k] - w).abs().max().item() for k, w in _trained(start, batches).items())
    raise Rejected(f"with {world} ranks the ranks agree, but their weights are {gap:.2g} away "
                   "from those of averaged DDP steps over every rank's batches (SGD, lr "
                   f"{LR}): train each batch once, with ddp_model, inside Join([ddp_model]).")


def _trained(start: dict[str, torch.Tensor], batches: Sequence[list[Batch]],
             by_active: bool = False, steps: int | None = None) -> dict[str, torch.Tensor]:
    """The weights DDP with Join gives: at step k, the mean-squared-error gradients of the
    ranks that still have a batch k, summed and divided by the world size (or by the number
    of those ranks: Join's divide_by_initial_world_size=False), then one SGD step."""
    weight, bias = (start["weight"].double().clone(), start["bias"].double().clone())
    for k in range(steps or max(len(b) for b in batches)):
        active = [b[k] for b in batches if k < len(b)]
        grads = [_gradient(weight, bias, x, y) for x, y in active]
        divide = len(active) if by_active else len(batches)
        weight = weight - LR * sum(g for g, _ in grads) / divide
        bias = bias - LR * sum(g for _, g in grads) / divide
    return {"weight": weight, "bias": bias}


def _gradient(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor,
              y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """d mse_loss(x @ weight.T + bias, y) / d (weight, bias), in closed form."""
    error = x.double() @ weight.T + bias - y.double()  # (batch, 1)
    scale = 2.0 / error.numel()
    return scale * error.T @ x.double(), scale * error.sum(dim=0)
