"""Checkpoints that survive a crash and resume training exactly: atomic files verified by a
checksum, and the whole training state (every rank's random state included) captured and
restored. Lesson 11 builds these; lesson 14 reuses them under torchrun.

A checkpoint is `step-00000012.pt` plus `step-00000012.pt.sha256`. The data file is
written to a temporary file in the same folder, flushed to disk and renamed into place
(`os.replace` is atomic on one file system); the checksum file is written the same way
*after* it, so a checkpoint counts only once both are complete and agree. A process killed
at any moment leaves either the previous checkpoints untouched, or a new complete one.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from course_lib.wrappers import unwrap

SUFFIX = ".sha256"
PATTERN = "step-*.pt"


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is incomplete or does not match its checksum."""


# -- atomic, verified files ---------------------------------------------------------------

def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint of `step` lives in `directory` (sortable by name)."""
    return Path(directory) / f"step-{step:08d}.pt"


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_save(obj: Any, path: str | os.PathLike) -> str:
    """torch.save(obj) to `path` so that a crash never leaves a partial file there; returns
    the checksum, which is written beside it (`path` + ".sha256") last."""
    path = Path(path)
    _write_atomic(path, lambda f: torch.save(obj, f))
    digest = sha256_of(path)
    _write_atomic(path.with_name(path.name + SUFFIX), lambda f: f.write(digest.encode()))
    return digest


def _write_atomic(path: Path, write: Any) -> None:
    """write(f) into a temporary file beside `path`, fsync it, rename it to `path`, and
    fsync the folder so that the rename itself is on disk."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def verify(path: str | os.PathLike) -> None:
    """Raise CorruptCheckpoint unless `path` and its checksum file exist and agree."""
    path = Path(path)
    sidecar = path.with_name(path.name + SUFFIX)
    if not path.exists() or not sidecar.exists():
        raise CorruptCheckpoint(f"{path}: incomplete checkpoint (the data file or its "
                                f"{SUFFIX} file is missing); use an older one")
    want, got = sidecar.read_text().strip(), sha256_of(path)
    if got != want:
        raise CorruptCheckpoint(f"{path}: checksum {got[:12]}... does not match the saved "
                                f"{want[:12]}...: the file is damaged; use an older one")


def verified_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """torch.load a checkpoint after checking its checksum (weights_only=True: plain
    tensors, numbers, strings and containers only)."""
    verify(path)
    return torch.load(path, map_location=map_location, weights_only=True)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in `directory` that verifies, or None; damaged or incomplete
    ones are skipped."""
    for path in sorted(Path(directory).glob(PATTERN), reverse=True):
        try:
            verify(path)
        except CorruptCheckpoint:
            continue
        return path
    return None


# -- random state -------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """This process's random state: torch (CPU, and the current GPU's when this process
    uses CUDA), numpy's (when numpy is loaded: torch does not need it, so an exported
    script may run without it) and Python's random, in types that torch.load(
    weights_only=True) accepts. A CPU rank on a GPU machine leaves CUDA alone (asking would
    create a CUDA context on GPU 0 in every rank)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what rng_state() returned (the sources it holds)."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "python" in state:
        random.setstate(_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tuples(value: Any) -> Any:
    """Lists back to tuples (random.setstate wants tuples all the way down)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def every_rank_rng_state() -> list[dict[str, Any]]:
    """Every rank's rng_state(), in rank order, on every rank (a collective). Pickled and
    sent as bytes by two all_gathers (the lengths, then the padded bytes) rather than with
    dist.all_gather_object, which needs numpy (torch's _tensor_to_object calls
    tensor.numpy()): a script that copies these helpers then runs with torch alone."""
    if not (dist.is_available() and dist.is_initialized()):
        return [rng_state()]
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    mine = torch.tensor(list(pickle.dumps(rng_state())), dtype=torch.uint8, device=device)
    ranks = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(ranks)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], device=device))
    longest = max(int(size) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: mine.numel()] = mine
    gathered = [torch.empty_like(padded) for _ in range(ranks)]
    dist.all_gather(gathered, padded)
    return [pickle.loads(bytes(g[: int(n)].tolist())) for g, n in zip(gathered, sizes)]


# -- the whole training state -------------------------------------------------------------

def capture(step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any = None, scaler: Any = None,
            loader_state: torch.Tensor | None = None, **extra: Any) -> dict[str, Any]:
    """Everything a resumed run needs to continue as if never stopped: bitwise at 2 ranks;
    at 3 or more, a fresh DDP's first step sums the gradients in its initial bucket order,
    so the weights differ in their last bits (about 1e-8). A collective: call it on every
    rank; rank 0 saves the result.

    `step` is the number of optimizer steps done; the sampler's epoch and position follow
    from it (`resume_position`). `loader_state` is the DataLoader generator's state that
    seeds the workers of the epoch the resume starts in: `loader_state_after` gives it.
    The model is saved unwrapped (no "module." prefix)."""
    state = {"step": step, "model": unwrap(model).state_dict(),
             "optimizer": optimizer.state_dict(), "rng": every_rank_rng_state()}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if loader_state is not None:
        state["loader_generator"] = loader_state
    return {**state, **extra}


def restore(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
            scheduler: Any = None, scaler: Any = None,
            loader_generator: torch.Generator | None = None) -> int:
    """Load what capture() saved into freshly built objects, this rank's random state
    last; returns the step to continue from. A piece the state lacks is left as built
    (lesson 11 uses that to show what each piece is for)."""
    rank, world_size = ((dist.get_rank(), dist.get_world_size()) if dist.is_initialized()
                        else (0, 1))
    if "rng" in state and len(state["rng"]) != world_size:
        raise ValueError(f"this checkpoint holds the random state of {len(state['rng'])} "
                         f"ranks, but {world_size} are running: resume at the same world "
                         "size for an exact resume, or re-seed each rank on purpose")
    unwrap(model).load_state_dict(state["model"])
    pieces = (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler))
    for name, obj in pieces:
        if obj is not None and name in state:
            obj.load_state_dict(state[name])
    if loader_generator is not None and "loader_generator" in state:
        loader_generator.set_state(state["loader_generator"])
    if "rng" in state:
        set_rng_state(state["rng"][rank])
    return state["step"]


def resume_position(step: int, batches_per_epoch: int) -> tuple[int, int]:
    """(epoch, batches to skip in it) for a run that has done `step` optimizer steps."""
    return divmod(step, batches_per_epoch)


def loader_state_after(batch_index: int, loader: DataLoader,
                       epoch_start: torch.Tensor) -> torch.Tensor:
    """The DataLoader generator state a checkpoint taken after batch `batch_index` (0-based)
    of the current epoch must hold, for `resume_position`'s (epoch, skip).

    Mid-epoch, the resume replays this epoch from its start (skipping the batches done), so
    it needs `epoch_start`, the state taken before this epoch's iter(loader). After the
    epoch's last batch the resume starts the *next* epoch, whose iter() draws its worker
    seeds from the generator as it is now: saving `epoch_start` there would give the next
    epoch the finished epoch's worker seeds again. Persistent workers are seeded once and
    carry their random state from epoch to epoch, which no generator state brings back:
    they are refused."""
    if loader.persistent_workers:
        raise ValueError("persistent_workers=True: the DataLoader's workers keep their random "
                         "state across epochs, so a resume cannot recreate it from the "
                         "generator; use persistent_workers=False for an exact resume (or a "
                         "loader that saves its workers' state, such as torchdata's "
                         "StatefulDataLoader)")
    if loader.generator is None:
        raise ValueError("the DataLoader has no generator: build it with "
                         "generator=torch.Generator().manual_seed(...) so that its worker "
                         "seeds can be saved and restored")
    if batch_index + 1 == len(loader):
        return loader.generator.get_state()
    return epoch_start
