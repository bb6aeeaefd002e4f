"""Checks for lesson 12's exercise: seed_rank(base_seed) makes a DDP job with dropout, random
augmentation and DataLoader workers bitwise reproducible, with per-rank random streams."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from course_lib.checks.common import CHECK_TIMEOUT, Rejected, check, on_ranks

WORLD_SIZES = (2, 4)
BASE_SEED = 1234
VOCAB, LENGTH, DIM, SAMPLES, GLOBAL_BATCH = 64, 2048, 8, 64, 32
THREADS = 2  # with 2 threads the backward of table[tokens] adds in a varying order
SOURCES = ("torch", "Python's random", "NumPy")


class NoisyTokens(Dataset):
    """Token sequences augmented with torch, Python's random and NumPy draws; each item also
    returns the three draws, so that the check sees what every source produced."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(i))
        target = (tokens < VOCAB // 4).float().mean() * 4
        draws = torch.tensor([torch.rand(()).item(), random.random(), np.random.rand()],
                             dtype=torch.float64)
        swap = torch.rand(LENGTH) < 0.1
        tokens = torch.where(swap, torch.randint(0, VOCAB, (LENGTH,)), tokens)
        noisy = target + 0.01 * (draws[1] + draws[2]).float()
        return tokens, noisy, draws


class BagOfTokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(0.1 * torch.randn(VOCAB, DIM))
        self.dropout = nn.Dropout(0.2)
        self.head = nn.Linear(DIM, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.table[tokens].mean(1))).squeeze(1)


def digest(tensors: list[torch.Tensor]) -> str:
    """A short SHA-256 of the tensors' bytes: equal only when every bit is."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def _job(fn: Callable, base_seed: int, num_workers: int) -> dict[str, Any]:
    """fn(base_seed) on this rank, then one epoch of DDP training; what every source drew."""
    torch.set_num_threads(THREADS)
    fn(base_seed)
    rank = dist.get_rank()
    seed = base_seed + rank
    seeded = {"torch": torch.initial_seed() == seed,
              "Python's random": random.getstate() == random.Random(seed).getstate(),
              "NumPy": _same_numpy_state(np.random.get_state(), seed)}
    found = {"seed": torch.initial_seed(), "seeded": seeded,
             "deterministic": torch.are_deterministic_algorithms_enabled()}
    model = BagOfTokens()
    found["init"] = digest(list(model.state_dict().values()))
    masks: list[torch.Tensor] = []
    model.dropout.register_forward_hook(lambda m, i, out: masks.append(out == 0))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.5)
    data = NoisyTokens()
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // dist.get_world_size(),
                        sampler=DistributedSampler(data, seed=0), num_workers=num_workers)
    draws, grads = [], []
    for tokens, target, drawn in loader:
        F.mse_loss(ddp(tokens), target).backward()
        grads.append(model.table.grad.clone())
        optimizer.step()
        optimizer.zero_grad()
        draws.append(drawn)
    drawn = torch.cat(draws)
    found["draws"] = {name: digest([drawn[:, k]]) for k, name in enumerate(SOURCES)}
    found["first draws"] = drawn[0].tolist()
    found["dropout"], found["grads"] = digest(masks), digest(grads)
    found["weights"] = digest(list(model.state_dict().values()))
    return found


def _same_numpy_state(state: tuple, seed: int) -> bool:
    want = np.random.RandomState(seed).get_state()
    return state[0] == want[0] and bool((state[1] == want[1]).all()) and state[2:] == want[2:]


def reference_seed_rank(base_seed: int) -> None:
    """The true answer: every generator seeded with base_seed + rank, deterministic ops."""
    seed = base_seed + dist.get_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


@check
def check_seed_rank(fn: Callable, timeout: float = CHECK_TIMEOUT) -> str:
    """fn(base_seed), called first on every rank, must make the job bitwise reproducible:
    torch, Python's random and NumPy seeded with base_seed + rank, deterministic algorithms."""
    checksums = []
    for n in WORLD_SIZES:
        runs = [on_ranks(_job, fn, n, (BASE_SEED, 2), timeout) for _ in range(2)]
        _judge_runs(runs, n, "with 2 DataLoader workers per rank")
        if n == WORLD_SIZES[0]:
            main = [on_ranks(_job, fn, n, (BASE_SEED, 0), timeout) for _ in range(2)]
            _judge_runs(main, n, "with num_workers=0 (augmentation in the rank itself)")
        _judge_seeds(runs[0], n)
        want = on_ranks(_job, reference_seed_rank, n, (BASE_SEED, 2), timeout)
        if runs[0][0]["weights"] != want[0]["weights"]:
            raise Rejected(f"on {n} ranks your run is reproducible, but its weights "
                           f"({runs[0][0]['weights']}) are not those of the recipe "
                           f"({want[0]['weights']}): something draws random numbers "
                           "after seeding, or seeds once more. Only seed, and turn on "
                           "deterministic algorithms.")
        checksums.append(f"{n} ranks: {runs[0][0]['weights']}")
    return (f"two runs each on {WORLD_SIZES[0]} and {WORLD_SIZES[1]} ranks (DataLoader "
            "workers, dropout, augmentation with torch, random and NumPy, 2 threads) "
            f"gave identical weights ({'; '.join(checksums)}), equal to the recipe's, "
            "with a different random stream on every rank.")


def _judge_runs(runs: list[list[dict[str, Any]]], n: int, how: str) -> None:
    """Two runs must agree bit for bit; if not, name the first source that changed."""
    for rank, (a, b) in enumerate(zip(*runs)):
        if a["seed"] != b["seed"] or a["init"] != b["init"]:
            raise Rejected(f"on {n} ranks, rank {rank}'s torch generator started from another "
                           f"seed in each run ({a['seed']}, then {b['seed']}): its initial "
                           "weights and dropout masks change from run to run. Call "
                           "torch.manual_seed(base_seed + rank).")
        for name in SOURCES:
            if a["draws"][name] != b["draws"][name]:
                raise Rejected(f"on {n} ranks {how}, the augmentation's {name} draws on rank "
                               f"{rank} changed between two runs: {name} was not seeded "
                               "(torch.manual_seed seeds torch only; DataLoader workers seed "
                               "their own generators, the rank itself does not). Seed it with "
                               "base_seed + rank too.")
        if a["dropout"] != b["dropout"]:
            raise Rejected(f"on {n} ranks, rank {rank}'s dropout masks changed between two "
                           "runs: seed torch with base_seed + rank.")
    first, second = runs[0][0], runs[1][0]
    changed = first["grads"] != second["grads"] or first["weights"] != second["weights"]
    if changed or not first["deterministic"]:
        seen = ("the embedding table's gradients changed between two runs" if changed else
                "both runs happened to agree this time, but they need not")
        raise Rejected(f"on {n} ranks {how}, every random draw was the same in both runs, "
                       f"yet {seen}: the backward of table[tokens] on {THREADS} threads adds "
                       "repeated tokens' gradients in a varying order. Call "
                       "torch.use_deterministic_algorithms(True).")


def _judge_seeds(results: list[dict[str, Any]], n: int) -> None:
    """Every rank's generators hold the true state: seeded with base_seed + rank."""
    if len({r["first draws"][0] for r in results}) < n:
        raise Rejected(f"on {n} ranks, every rank drew the same augmentation noise and "
                       f"dropout masks (rank 0's torch seed {results[0]['seed']}, rank 1's "
                       f"{results[1]['seed']}): the ranks' samples get correlated noise. Seed "
                       "each rank with base_seed + rank.")
    for rank, r in enumerate(results):
        wrong = [name for name, ok in r["seeded"].items() if not ok]
        if wrong:
            raise Rejected(f"on {n} ranks, rank {rank}'s generators ({', '.join(wrong)}) are "
                           f"not seeded with base_seed + rank = {BASE_SEED + rank} (torch's "
                           f"seed is {r['seed']}). Use seed = base_seed + "
                           "dist.get_rank() for all three.")
