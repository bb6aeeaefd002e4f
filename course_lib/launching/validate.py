"""Check launch() arguments up front, so bad input fails at once with a clear message."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from course_lib import devices

BACKENDS = ("auto", "gloo", "nccl")
MAX_CPU_RANKS = max(16, 2 * (os.cpu_count() or 1))
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT")


def check_launch_args(
    fn: Any, world_size: Any, args: Any, kwargs: Any, timeout: Any, env: Any
) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, str]]:
    """Validate launch() arguments; return args, kwargs and env in their canonical form."""
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on every rank, got {fn!r}.")
    check_world_size(world_size)
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}"
                        f" (for one argument write args=(x,)).")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    check_seconds("timeout", timeout)
    return tuple(args), dict(kwargs or {}), check_env(env)


def check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")


def check_world_size(world_size: Any) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks), got {world_size!r}.")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}.")
    if world_size > MAX_CPU_RANKS:
        raise ValueError(
            f"world_size={world_size} is more ranks than this machine can run "
            f"({os.cpu_count()} cores; at most {MAX_CPU_RANKS}). The lessons use 2-4 ranks; "
            "for more, use torchrun on a cluster (lesson 14)."
        )


def check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of environment variables, got {type(env).__name__}.")
    clean = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"env keys must be variable names (str), got {key!r}.")
        if key in LAUNCHER_VARS:
            raise ValueError(f"env sets {key}, which the launcher sets for every rank itself.")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise TypeError(f"env[{key!r}] must be a str or a number, got {value!r}.")
        clean[key] = str(value)
    threads = clean.get("OMP_NUM_THREADS", "1")
    if not threads.isdigit() or int(threads) < 1:
        raise ValueError(f"env['OMP_NUM_THREADS'] must be a whole number >= 1, got {threads!r}.")
    return clean


def choose_backend(backend: Any, world_size: int, env: Mapping[str, str] | None = None) -> str:
    """Resolve "auto" by the course's rule (course_lib.devices): NCCL when the ranks see a GPU
    each, with the launch's `env` applied (CUDA_VISIBLE_DEVICES="" hides every GPU), else gloo.

    When "auto" falls back to gloo although the ranks see GPUs (fewer than ranks), one line
    says so, so that a learner on a 1-GPU machine knows why the ranks run on the CPU. Ranks
    without GPUs say nothing: gloo is the only choice there.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}.")
    gpus = devices.visible_gpus(dict(env or {}))
    where = ("this launch's env leaves its ranks" if "CUDA_VISIBLE_DEVICES" in (env or {})
             else "this machine has")
    if backend == "auto":
        chosen = devices.backend_for(world_size, gpus)
        if chosen == "gloo" and gpus:
            print(f"backend='auto': gloo on the CPU, because {world_size} ranks need "
                  f"{world_size} GPUs for NCCL and {where} {gpus}.")
        return chosen
    if backend == "nccl" and devices.backend_for(world_size, gpus) != "nccl":
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: {world_size} ranks, and {where} "
            f"{gpus} GPU(s). Use backend='gloo' (CPU) or backend='auto', which picks gloo "
            "when GPUs are short."
        )
    return str(backend)
