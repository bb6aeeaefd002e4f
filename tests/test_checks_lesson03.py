"""Lesson 03's exercise checks: each accepts the worked solution and a differently written
correct answer, and rejects plausible wrong answers with the hint that names their symptom."""

import time

import pytest
import torch
import torch.distributed as dist
from checking import check_helpers
from torch import nn
from torch.distributed.algorithms import Join
from torch.utils.data import DataLoader, DistributedSampler, Subset

from course_lib.checks.lesson03 import check_global_accuracy, check_read_epochs, check_train_uneven

NOTEBOOK = "03_data_sharding.ipynb"
FAST = 6  # seconds: a loop that hangs is stopped after this long


solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)
# Answers that read in DataLoader worker processes get the check's own time limit: starting
# workers takes seconds on a loaded machine, and a limit hit would hide what is tested.
_, accepts_slow, rejects_slow = check_helpers(NOTEBOOK)



# -- read_epochs ----------------------------------------------------------------------------

def read_by_hand(dataset, epochs, batch_size):
    """One shared permutation per epoch, every world_size-th index for this rank."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    read = []
    for epoch in range(epochs):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(epoch))
        read.append([dataset[i][1] for i in order[rank::world_size].tolist()])
    return read


def loop(loader, sampler, epochs, set_epoch="before"):
    read = []
    for epoch in range(epochs):
        if set_epoch == "before":
            sampler.set_epoch(epoch)
        read.append([i for _, index in loader for i in index.tolist()])
        if set_epoch == "after":
            sampler.set_epoch(epoch)
    return read


def read_without_sampler(dataset, epochs, batch_size):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return [[i for _, index in loader for i in index.tolist()] for _ in range(epochs)]


def read_without_set_epoch(dataset, epochs, batch_size):
    sampler = DistributedSampler(dataset)
    return loop(DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler, epochs,
                set_epoch="never")


def read_set_epoch_after(dataset, epochs, batch_size):
    sampler = DistributedSampler(dataset)
    return loop(DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler, epochs,
                set_epoch="after")


def read_shuffle_twice(dataset, epochs, batch_size):
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, sampler=sampler)
    return loop(loader, sampler, epochs)


def read_unshuffled(dataset, epochs, batch_size):
    sampler = DistributedSampler(dataset, shuffle=False)
    return loop(DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler, epochs)


def read_own_seed_per_rank(dataset, epochs, batch_size):
    sampler = DistributedSampler(dataset, seed=dist.get_rank())  # ranks shuffle differently
    return loop(DataLoader(dataset, batch_size=batch_size, sampler=sampler), sampler, epochs)


def read_with_workers(dataset, epochs, batch_size):
    """The worked answer, reading in two DataLoader worker processes."""
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2)
    return loop(loader, sampler, epochs)


def read_same_split_every_epoch(dataset, epochs, batch_size):
    """Each rank keeps one fixed strided shard and only reshuffles it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    shard = list(range(rank, len(dataset), world_size))
    read = []
    for epoch in range(epochs):
        order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(epoch))
        read.append([dataset[shard[i]][1] for i in order.tolist()])
    return read


def read_all_but_return_the_sampler(dataset, epochs, batch_size):
    """Reads everything in two workers, but reports the sampler's share as what it read."""
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2)
    read = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for _ in loader:
            pass   # the training step
        read.append(list(sampler))
    return read


def test_read_epochs_counts_reads_in_dataloader_workers(capsys):
    accepts_slow(check_read_epochs, read_with_workers, capsys)
    rejects_slow(check_read_epochs, read_all_but_return_the_sampler,
                 "read every one of the 24 samples each epoch", capsys)


@pytest.mark.parametrize("fn", ["solution", read_by_hand])
def test_read_epochs_accepts(fn, capsys):
    accepts(check_read_epochs, solution("read_epochs") if fn == "solution" else fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (read_without_sampler, "every rank read all 24 samples in epoch 0"),
    (read_without_set_epoch, "in the same order in all 3 epochs: call sampler.set_epoch"),
    (read_set_epoch_after, "read epochs 0 and 1 in the same order"),
    (read_shuffle_twice, "mutually exclusive with shuffle"),
    (read_unshuffled, "in increasing order in every epoch"),
    (read_own_seed_per_rank, "were read more than once in epoch 0"),
    (read_same_split_every_epoch, "the split between the ranks never changes"),
])
def test_read_epochs_rejects(fn, hint, capsys):
    rejects(check_read_epochs, fn, hint, capsys)


# -- global_accuracy ------------------------------------------------------------------------

def accuracy_by_chunks(predict, dataset):
    """Contiguous chunks and all_gather_object instead of strided shards and all_reduce."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    per_rank = -(-len(dataset) // world_size)
    mine = range(rank * per_rank, min(len(dataset), (rank + 1) * per_rank))
    counts = [0, 0]
    for i in mine:
        x, y = dataset[i]
        counts[0] += int(predict(x) == y)
        counts[1] += 1
    everyone = [None] * world_size
    dist.all_gather_object(everyone, counts)
    return sum(c for c, _ in everyone) / sum(t for _, t in everyone)


def shard_counts(predict, dataset, sampler):
    correct, total = 0, 0
    for x, y in DataLoader(dataset, batch_size=4, sampler=sampler):
        correct += (predict(x) == y).sum().item()
        total += len(y)
    return correct, total


def accuracy_per_rank(predict, dataset):
    correct, total = shard_counts(predict, dataset, range(dist.get_rank(), len(dataset),
                                                          dist.get_world_size()))
    return correct / total


def accuracy_padded(predict, dataset):
    counts = torch.tensor(shard_counts(predict, dataset, DistributedSampler(dataset)))
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_dropped(predict, dataset):
    sampler = DistributedSampler(dataset, drop_last=True)
    counts = torch.tensor(shard_counts(predict, dataset, sampler))
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_mean_of_ranks(predict, dataset):
    accuracy = torch.tensor([accuracy_per_rank(predict, dataset)])
    dist.all_reduce(accuracy)
    return accuracy.item() / dist.get_world_size()


def accuracy_everywhere(predict, dataset):
    correct, total = shard_counts(predict, dataset, range(len(dataset)))
    return correct / total


def accuracy_with_workers(predict, dataset):
    """Strided shards read by two DataLoader workers; counts reduced as one float tensor."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    shard = Subset(dataset, range(rank, len(dataset), world_size))
    counts = torch.zeros(2)
    for x, y in DataLoader(shard, batch_size=2, num_workers=2):
        counts += torch.tensor([(predict(x) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_everywhere_with_workers(predict, dataset):
    correct, total = 0, 0
    for x, y in DataLoader(dataset, batch_size=4, num_workers=2):
        correct += (predict(x) == y).sum().item()
        total += len(y)
    return correct / total


def accuracy_padded_with_workers(predict, dataset):
    sampler = DistributedSampler(dataset, shuffle=False)
    correct, total = 0, 0
    for x, y in DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2):
        correct += (predict(x) == y).sum().item()
        total += len(y)
    counts = torch.tensor([correct, total])
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def accuracy_mean_of_chunk_ratios(predict, dataset):
    """Contiguous chunks, then the mean of the ranks' accuracies."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    per_rank = -(-len(dataset) // world_size)
    chunk = range(rank * per_rank, min(len(dataset), (rank + 1) * per_rank))
    correct, total = shard_counts(predict, dataset, chunk)
    accuracy = torch.tensor([correct / total])
    dist.all_reduce(accuracy)
    return accuracy.item() / world_size


def accuracy_reduce_thrown_away(predict, dataset):
    correct, total = shard_counts(predict, dataset, range(dist.get_rank(), len(dataset),
                                                          dist.get_world_size()))
    dist.all_reduce(torch.tensor([correct, total]))   # the reduced tensor is never used
    return correct / total


@pytest.mark.parametrize("fn, hint", [
    (accuracy_with_workers, None),
    (accuracy_padded_with_workers, "indices [0, 1] were evaluated on more than one"),
    (accuracy_everywhere_with_workers, "DataLoader workers included): the work was not split"),
])
def test_global_accuracy_counts_reads_in_dataloader_workers(fn, hint, capsys):
    if hint is None:
        accepts_slow(check_global_accuracy, fn, capsys)
    else:
        rejects_slow(check_global_accuracy, fn, hint, capsys)


@pytest.mark.parametrize("fn", ["solution", accuracy_by_chunks])
def test_global_accuracy_accepts(fn, capsys):
    fn = solution("global_accuracy") if fn == "solution" else fn
    accepts(check_global_accuracy, fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (accuracy_per_rank, "Each rank returned the accuracy of the samples it read itself"),
    (accuracy_reduce_thrown_away, "use that tensor afterwards"),
    (accuracy_padded, "an accuracy over 12 reads for a dataset of 10"),
    (accuracy_dropped, "drop_last=True leaves samples out"),
    (accuracy_mean_of_ranks, "the mean of the ranks' own accuracies"),
    (accuracy_mean_of_chunk_ratios, "the ranks read [3, 3, 3, 1] samples"),
    (accuracy_everywhere, "each of the 4 ranks read all 10 samples"),
])
def test_global_accuracy_rejects(fn, hint, capsys):
    rejects(check_global_accuracy, fn, hint, capsys)


# -- train_uneven ---------------------------------------------------------------------------

def step(model, optimizer, x, y):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_with_ddp_join(ddp_model, batches, optimizer):
    with ddp_model.join():  # DDP's own context manager, the same hook as Join([ddp_model])
        for x, y in batches:
            step(ddp_model, optimizer, x, y)


def train_plain(ddp_model, batches, optimizer):
    for x, y in batches:
        step(ddp_model, optimizer, x, y)


def train_plain_then_barrier(ddp_model, batches, optimizer):
    train_plain(ddp_model, batches, optimizer)
    dist.barrier()


def fewest_batches(batches):
    n = torch.tensor(len(batches))
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    return int(n)


def train_common_batches_only(ddp_model, batches, optimizer):
    for _, (x, y) in zip(range(fewest_batches(batches)), batches):
        step(ddp_model, optimizer, x, y)


def train_extras_outside_ddp(ddp_model, batches, optimizer):
    common = fewest_batches(batches)
    for i, (x, y) in enumerate(batches):
        step(ddp_model if i < common else ddp_model.module, optimizer, x, y)


def train_join_by_active(ddp_model, batches, optimizer):
    """Join that divides by the ranks still training (also a correct choice)."""
    with Join([ddp_model], divide_by_initial_world_size=False):
        for x, y in batches:
            step(ddp_model, optimizer, x, y)


def train_padded_with_zero_loss(ddp_model, batches, optimizer):
    """No Join: the short ranks make extra steps whose loss (and gradient) is zero."""
    most = torch.tensor(len(batches))
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    batches = list(batches)
    for i in range(int(most)):
        x, y = batches[min(i, len(batches) - 1)]
        loss = nn.functional.mse_loss(ddp_model(x), y) * (i < len(batches))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train_reads_all_trains_common(ddp_model, batches, optimizer):
    """Iterates every batch, but trains only on as many as the shortest rank has."""
    common = fewest_batches(batches)
    for i, (x, y) in enumerate(batches):
        if i < common:
            step(ddp_model, optimizer, x, y)


def train_alone_then_copy_rank_0(ddp_model, batches, optimizer):
    """Each rank trains the bare module on its own data; rank 0's weights are copied at the end."""
    for x, y in batches:
        step(ddp_model.module, optimizer, x, y)
    for p in ddp_model.module.parameters():
        dist.broadcast(p.data, src=0)


@pytest.mark.parametrize("fn", ["solution", train_with_ddp_join, train_join_by_active,
                                train_padded_with_zero_loss])
def test_train_uneven_accepts(fn, capsys):
    accepts(check_train_uneven, solution("train_uneven") if fn == "solution" else fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (train_plain, "rank 0 took 3 of its 3 batches; rank 1 took 4 of its 5 batches"),
    (train_plain_then_barrier, "Wrap the loop in Join([ddp_model])"),
    (train_common_batches_only, "rank 1 trained on 3 of its 5 batches"),
    (train_extras_outside_ddp, "rank 1's weights differ from rank 0's"),
    (train_reads_all_trains_common, "training on the first 3 batches of each rank only"),
    (train_alone_then_copy_rank_0, "the weights that rank 0 gets by training alone"),
])
def test_train_uneven_rejects(fn, hint, capsys):
    start = time.monotonic()
    rejects(check_train_uneven, fn, hint, capsys)
    assert time.monotonic() - start < FAST + 5


# -- time limit -------------------------------------------------------------------------------

def read_slowly(dataset, epochs, batch_size):
    """The worked answer behind a slow start (a big dataset's index, say)."""
    time.sleep(4)
    return read_with_workers(dataset, epochs, batch_size)


def test_a_time_limit_hit_is_said_in_the_hint(capsys):
    rejects(check_read_epochs, read_slowly, "the check stops the ranks after 2 s", capsys,
            timeout=2)
