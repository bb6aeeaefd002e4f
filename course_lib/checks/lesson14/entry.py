"""The script torchrun starts in lesson 14's check:

    python -m course_lib.checks.lesson14.entry FUNCTION.pkl OUT_DIR

It loads the learner's main() (cloudpickled by the check) and calls it with
sys.argv = [script, OUT_DIR], as `torchrun ... train.py OUT_DIR` would. It watches what
main() passes to init_process_group and whether the group is still there when main() ends,
and says so in a line that starts with MARK, which the check reads back. With
COURSE_CHECK14_GPUS=N, torch.cuda reports N GPUs (a stand-in: no GPU is used), so that the
check can see which backend main() picks on a node with fewer GPUs than processes.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from course_lib.checks.lesson14.training import RAISE, InjectedFailure

MARK = "CHECK14:"  # the entry's own lines, read back by the check
GPUS = "COURSE_CHECK14_GPUS"  # set: the GPUs torch.cuda reports to main() (none is used)


def _entry(argv: list[str]) -> None:
    """torchrun's worker: call the pickled main() as `script OUT_DIR` would run it, watching
    what it passes to init_process_group and whether it leaves the group on every path."""
    if len(argv) != 2:
        sys.exit("usage: python -m course_lib.checks.lesson14.entry FUNCTION.pkl OUT_DIR")
    _watch_init()  # before loading: a main() that imported init_process_group gets this one
    _report_gpus()
    main = cloudpickle.loads(Path(argv[0]).read_bytes())
    sys.argv = ["train.py", argv[1]]
    try:
        main()
    except InjectedFailure:  # the error we asked for, let through by main()
        _leave(0, "raised" if dist.is_initialized() else None)
    if os.environ.get(RAISE):
        _say("swallowed InjectedFailure")
    _leave(0, "returned" if dist.is_initialized() else None)


def _watch_init() -> None:
    """Replace init_process_group by one that first compares the rank and world size it is
    given with torchrun's; a mismatch ends the process at once (its peers would wait for
    ranks that never come) with a line that says what was given."""
    original = dist.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        given = signature.bind_partial(*args, **kwargs).arguments
        rank, size = given.get("rank", -1), given.get("world_size", -1)
        env = {k: os.environ.get(k, "?") for k in
               ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        if str(rank) not in ("-1", env["RANK"]) or str(size) not in ("-1", env["WORLD_SIZE"]):
            _say(f"init rank={rank} world_size={size} "
                 + " ".join(f"{k}={v}" for k, v in env.items()))
            _leave(3, None)
        if os.environ.get(GPUS) and "nccl" in str(given.get("backend") or "").lower():
            _nccl_without_gpu(f"backend={given['backend']}")
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group


def _report_gpus() -> None:
    """With COURSE_CHECK14_GPUS=N: torch.cuda says it has N GPUs, and set_device accepts
    cuda:0 to cuda:N-1 (doing nothing); a higher index, or NCCL chosen (see _watch_init),
    ends the process with a MARK line: on a real node of more processes than GPUs, NCCL
    fails there ("invalid device ordinal")."""
    if not os.environ.get(GPUS):
        return
    count = int(os.environ[GPUS])

    def set_device(device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        if index is not None and index >= count:
            _nccl_without_gpu(f"set_device={index}")

    torch.cuda.is_available = lambda: count > 0
    torch.cuda.device_count = lambda: count
    torch.cuda.set_device = set_device


def _nccl_without_gpu(what: str) -> None:
    _say(f"nccl-without-gpu {what} gpus={os.environ[GPUS]} "
         f"LOCAL_WORLD_SIZE={os.environ.get('LOCAL_WORLD_SIZE', '?')}")
    _leave(3, None)


def _say(line: str) -> None:
    print(f"{MARK} {line}", flush=True)


def _leave(code: int, left_group: str | None) -> None:
    """Leave without running C++ destructors: PyTorch 2.13's gloo can abort there
    ("terminate called without an active exception", docs/facts.md), and that is not the
    learner's code; the course's own ranks end the same way. `left_group` names how main()
    ended with the group still initialized (exit code 4)."""
    if left_group:
        _say(f"left-group-initialized {left_group}")
        code = 4
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _entry(sys.argv[1:])
