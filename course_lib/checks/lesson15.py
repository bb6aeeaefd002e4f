"""One job: judge lesson 15's exercise, a colleague's training function fixed (no
DistributedSampler, accumulation without no_sync(), a checkpoint saved from the DDP
wrapper), and name the pitfalls it had. Measured on the ranks: the indices each rank read,
DDP's all-reduces, the optimizer steps, the final weights, and rank 0's checkpoint loaded
into a plain model. The truth: one process doing SGD on the mean loss of each step's global
batch of the samples the ranks read. The same scene also runs under the x-ray, whose
confirmed findings reject an answer and appear in every hint."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

from course_lib.checks.common import (
    CHECK_TIMEOUT,
    RecordingSGD,
    Rejected,
    check,
    differing,
    on_ranks,
    state_snapshot,
)
from course_lib.teach.case_files import as_node, split_by_node
from course_lib.teach.cases.colleague import BATCH, K, colleague_train
from course_lib.telemetry import Recorder
from course_lib.words import listing

SEED = 15
LR = 0.05
STEPS = 3  # optimizer steps per rank in one epoch
WORLD_SIZES = (2, 4)
# 4 ranks run as 2 nodes of 2 (torchrun's per-node variables set so): on launch's one node
# the local numbers equal the global ones, and case 4's sampler by LOCAL_RANK would pass.
NODES = {2: 1, 4: 2}
CHECKPOINT = "checkpoint.pt"
# PyTorch's error texts that a fix can meet, with what they mean for it.
KNOWN = [("sampler option is mutually exclusive with shuffle",
          "DataLoader refuses shuffle=True beside sampler= (P18, lesson 03): "
          "DistributedSampler shuffles by itself (its shuffle=True is the default, reshuffled "
          "each epoch by sampler.set_epoch(epoch)); drop shuffle= from the DataLoader")]
NAMES = {"P03": "no DistributedSampler", "P09": "accumulation without no_sync()",
         "P12": "checkpoint saved from the DDP wrapper ('module.' keys)"}


def dataset_size(world_size: int) -> int:
    """One epoch is exactly STEPS optimizer steps of K micro-batches of BATCH on every rank."""
    return world_size * STEPS * K * BATCH


def make_model() -> nn.Module:
    """The check's model, the same weights in every process (the kernel's state kept)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


class RecordingData(Dataset):
    """A fixed regression data set that notes every index read, in order (num_workers=0)."""

    def __init__(self, n: int) -> None:
        gen = torch.Generator().manual_seed(SEED)
        self.x = torch.randn(n, 6, generator=gen)
        self.y = self.x[:, :3].sum(1, keepdim=True).sin()
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads.append(int(index))
        return self.x[index], self.y[index]


def _train_on_rank(fn: Callable, folder: str, nodes: int = 1) -> dict[str, Any]:
    """fn(model, optimizer, dataset, checkpoint_path) on this rank, as one of `nodes` nodes,
    then the checkpoint loaded into a plain model (as evaluation code would); what it did."""
    as_node(nodes)
    model = DDP(make_model())
    rec = Recorder()
    rec.watch_ddp(model, grads=False)  # one row per all-reduce DDP makes
    optimizer = RecordingSGD(model.parameters(), lr=LR)
    dataset = RecordingData(dataset_size(dist.get_world_size()))
    path = Path(folder) / CHECKPOINT
    fn(model, optimizer, dataset, str(path))
    dist.barrier()  # the check's own: every rank is done before the file is read
    return {"reads": dataset.reads, "allreduces": len(rec.telemetry().comms),
            "optimizer_steps": len(optimizer.seen), "weights": state_snapshot(model.module),
            "load_error": _load_error(path)}


def _load_error(path: Path) -> str | None:
    """None when the checkpoint at `path` loads into a plain model, else the first line of
    the error (what an evaluation script meets)."""
    if not path.exists():
        return None  # judged in the kernel: no checkpoint
    try:
        make_model().load_state_dict(torch.load(path, map_location="cpu"))
    except (RuntimeError, TypeError, AttributeError, KeyError) as error:
        return " ".join(line.strip() for line in str(error).splitlines()[:2])[:200]
    return None


def run_script(fn: Callable, world_size: int, timeout: float = CHECK_TIMEOUT) -> dict[str, Any]:
    """Run fn on `world_size` ranks (NODES[world_size] nodes); the ranks' records and the
    checkpoint rank 0 saved (None when no file was written)."""
    with tempfile.TemporaryDirectory(prefix="lesson15-") as folder:
        results = on_ranks(_train_on_rank, fn, world_size, (folder, NODES[world_size]), timeout,
                           known=KNOWN)
        path = Path(folder) / CHECKPOINT
        saved = torch.load(path, map_location="cpu") if path.exists() else None
    return {"ranks": results, "checkpoint": saved, "world_size": world_size,
            "nodes": NODES[world_size]}


# -- the truth, computed in the kernel ----------------------------------------------------------

def reference(reads: list[list[int]], world_size: int, lr: float = LR) -> dict[str, torch.Tensor]:
    """One process: SGD on the mean loss of each step's global batch, the samples every rank
    read in its K micro-batches of that step."""
    data = RecordingData(dataset_size(world_size))
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    per_step = K * BATCH
    for step in range(STEPS):
        index = [i for mine in reads for i in mine[step * per_step:(step + 1) * per_step]]
        nn.functional.mse_loss(model(data.x[index]), data.y[index]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return state_snapshot(model)


def xray_of(fn: Callable, world_size: int, timeout: float = CHECK_TIMEOUT) -> list[Any]:
    """The x-ray's confirmed findings on the same scene (course_lib.xray, lesson 15)."""
    from course_lib.xray import xray

    with tempfile.TemporaryDirectory(prefix="lesson15-xray-") as folder:
        report = xray(_train_on_rank, world_size, args=(fn, folder, NODES[world_size]),
                      timeout=timeout, echo=False)
    return [f for f in report.findings if f.certainty == "confirmed"]


def xray_summary(found: list[Any]) -> str:
    """One line per finding: what the x-ray saw, with its lesson."""
    if not found:
        return "the x-ray found no pitfall."
    return "the x-ray found: " + "; ".join(f"{f.id} ({f.evidence}; read {f.lesson})"
                                           for f in found)


# -- what a run shows ---------------------------------------------------------------------------

def findings(run: dict[str, Any]) -> dict[str, str]:
    """The pitfalls this run shows, each with its evidence in one line (empty: none)."""
    ranks, n = run["ranks"], run["world_size"]
    found = {}
    readers = Counter(i for result in ranks for i in set(result["reads"]))
    twice = sum(1 for c in readers.values() if c > 1)
    if twice:
        nodes = run.get("nodes", 1)
        how = (f"rank 0 read {len(ranks[0]['reads'])}); the DataLoader needs "
               "sampler=DistributedSampler(dataset)")
        if split_by_node([r["reads"] for r in ranks], nodes):
            how = (f"on {nodes} nodes of {n // nodes}, rank 0 and rank {n // nodes} (local rank "
                   "0 of each node) read the same samples): the sampler was split by the local "
                   "rank and world size; give DistributedSampler neither, and it takes the "
                   "global ones from the process group")
        found["P03"] = (f"{twice} of {dataset_size(n)} samples were read by more than one rank "
                        f"({how}")
    first = ranks[0]
    if first["optimizer_steps"] and first["allreduces"] > first["optimizer_steps"]:
        found["P09"] = (f"rank 0 made {first['allreduces']} all-reduces for "
                        f"{first['optimizer_steps']} optimizer steps: every backward "
                        "synchronises; run the first K-1 micro-batches inside model.no_sync()")
    saved, load_error = run["checkpoint"], first["load_error"]
    if isinstance(saved, dict) and any(str(k).startswith("module.") for k in saved):
        failed = f", and loading it into the plain model failed: {load_error}" if load_error else ""
        found["P12"] = ("the checkpoint's keys start with 'module.' (e.g. "
                        f"{next(iter(saved))!r}){failed}; save model.module.state_dict()")
    return found


# -- the check ----------------------------------------------------------------------------------

@check
def check_fixed_train(fn: Callable, pitfalls_found: Callable | None = None,
                      timeout: float = CHECK_TIMEOUT) -> str:
    """fn(model, optimizer, dataset, checkpoint_path), the colleague's function fixed: each
    rank reads its own share, one all-reduce per optimizer step, the weights of one process
    on the global batches, and a checkpoint a plain model loads. With `pitfalls_found`
    (a function returning the ids you found), also compares them with what the colleague's
    function shows when it runs."""
    named = ""
    if pitfalls_found is not None:
        named = _judge_names(pitfalls_found, timeout) + " "
    for n in WORLD_SIZES:
        run = run_script(fn, n, timeout)
        found = xray_of(fn, n, timeout)
        try:
            _judge_fix(run)
        except Rejected as rejected:
            raise Rejected(f"{rejected}\n  On this run {xray_summary(found)}",
                           kind=rejected.kind) from None
        if found:
            raise Rejected(f"on {n} ranks {xray_summary(found)}")
    return (f"{named}On {listing(WORLD_SIZES)} ranks, {STEPS} optimizer steps of {K} "
            f"micro-batches: every sample read once, one all-reduce per optimizer step, "
            "the weights of one process on the same global batches, a checkpoint "
            "that a plain model loads, and the x-ray found no pitfall.")


def _named(pitfalls_found: Callable) -> set[str]:
    """The ids pitfalls_found() returns, as upper-case strings; a clear error otherwise."""
    answer = pitfalls_found()
    if isinstance(answer, str):
        answer = [answer]
    if not isinstance(answer, (set, frozenset, list, tuple)):
        raise Rejected(f"pitfalls_found() must return the ids you found, as a set such as "
                       f'{{"P01", "P02"}}; it returned {answer!r}.')
    return {str(i).strip().upper() for i in answer}


def _judge_names(pitfalls_found: Callable, timeout: float) -> str:
    named = _named(pitfalls_found)
    shown = findings(run_script(colleague_train, WORLD_SIZES[0], timeout))
    missed, extra = sorted(set(shown) - named), sorted(named - set(shown))
    if missed:
        raise Rejected(f"you missed {missed[0]} ({NAMES[missed[0]]}): running the colleague's "
                       f"function on {WORLD_SIZES[0]} ranks, {shown[missed[0]]}.")
    if extra:
        raise Rejected(f"you named {listing(extra)}, but running the colleague's function on "
                       f"{WORLD_SIZES[0]} ranks shows no sign of it; what the run shows: "
                       f"{listing(sorted(shown))}.")
    return f"Named: {listing(sorted(named))}, each shown by the colleague's run."


def _judge_fix(run: dict[str, Any]) -> None:
    n, ranks = run["world_size"], run["ranks"]
    where = f"on {n} ranks: "
    found = findings(run)
    if found:
        pitfall, evidence = next(iter(found.items()))
        raise Rejected(f"{where}{evidence} ({pitfall}).")
    _judge_reads(ranks, n, where)
    for rank, result in enumerate(ranks):
        if result["optimizer_steps"] != STEPS:
            raise Rejected(f"{where}rank {rank} made {result['optimizer_steps']} optimizer "
                           f"steps for {STEPS * K} micro-batches of its share; with {K} "
                           f"micro-batches per step it should make {STEPS}.")
        if result["allreduces"] != STEPS:
            raise Rejected(f"{where}rank {rank} made {result['allreduces']} all-reduces for "
                           f"{STEPS} optimizer steps: the backward of the last micro-batch of "
                           "each step, and only it, runs outside model.no_sync().")
    _judge_weights(ranks, n, where)
    _judge_checkpoint(run["checkpoint"], ranks[0]["weights"], where)


def _judge_reads(ranks: list[dict[str, Any]], n: int, where: str) -> None:
    read = set().union(*(set(r["reads"]) for r in ranks))
    missing = dataset_size(n) - len(read)
    if missing:
        raise Rejected(f"{where}{missing} of {dataset_size(n)} samples were never read: "
                       "together the ranks must read the whole data set once.")


def _judge_weights(ranks: list[dict[str, Any]], n: int, where: str) -> None:
    reads = [r["reads"] for r in ranks]
    want = reference(reads, n)
    for rank, result in enumerate(ranks):
        wrong = differing(result["weights"], want)
        if not wrong:
            continue
        if not differing(result["weights"], reference(reads, n, LR * K)):
            raise Rejected(f"{where}rank {rank}'s weights are those of one process with a "
                           f"learning rate {K} times too large: divide each micro-batch's "
                           f"loss by K ({K}) (X6).")
        raise Rejected(f"{where}rank {rank}'s {listing(wrong)} after {STEPS} steps differ "
                       "from one process doing SGD on the mean loss of the same global "
                       "batches.")


def _judge_checkpoint(saved: Any, weights: dict[str, torch.Tensor], where: str) -> None:
    if saved is None:
        raise Rejected(f"{where}no checkpoint at checkpoint_path: rank 0 must save "
                       "model.module.state_dict() there (torch.save).")
    plain = make_model()
    try:
        plain.load_state_dict(saved)
    except (RuntimeError, TypeError, AttributeError, KeyError) as error:
        first = str(error).splitlines()[0]
        raise Rejected(f"{where}the checkpoint does not load into the plain model: "
                       f"{first[:200]}") from None
    wrong = differing(state_snapshot(plain), weights)
    if wrong:
        raise Rejected(f"{where}the checkpoint's {listing(wrong)} differ from the trained "
                       "weights: save at the end of training.")
