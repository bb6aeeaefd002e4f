"""Why a script could not be x-rayed: the first line of the report when it did not train.

A script that needs a GPU on a CPU machine, that its own argument parser stopped, that
launched no process or that exited before training shows none of the pitfalls, and a
"no pitfalls found" would mislead: this names the cause and what to do.
"""

from __future__ import annotations

import re
from typing import Any

from course_lib.xray.run_events import RunEvents

# A GPU-only call on a machine without (enough) GPUs, as torch words it.
_GPU = re.compile(r"_cuda_setDevice|_cuda_getDeviceCount|Torch not compiled with CUDA|"
                  r"No CUDA GPUs are available|Found no NVIDIA driver|invalid device ordinal|"
                  r"NCCL.*(unavailable|not available|not built)|ProcessGroupNCCL is only")
_USAGE = re.compile(r"^usage: .*$", re.MULTILINE)
_ARG_ERROR = re.compile(r"^[\w.\-]+: error: (.*)$", re.MULTILINE)
# What training leaves: a DDP model, an optimizer step, a batch read, a collective.
_TRAINING = ("ddp", "opt_step", "pass", "collective")


def cause(obs: RunEvents) -> str:
    """One line: why the script did not train here and what to do ("" when it trained or
    failed for a reason the error itself names)."""
    failures = list(getattr(obs.error, "failures", []) or [])
    text = "\n".join(f"{f.message}\n" + "\n".join(f.output_tail) for f in failures)
    if _GPU.search(text):
        return ("Cannot run here: the script makes a GPU-only call (torch.cuda / NCCL) and "
                "this machine has no GPU for every rank. Run it on a GPU machine, or choose "
                "the device from the process group's backend (course_lib.rank_device(): "
                "cuda:LOCAL_RANK with NCCL, the CPU with gloo).")
    usage = _ARG_ERROR.search(text) if _USAGE.search(text) else None
    if usage:
        return (f"Cannot run here: the script's own argument parser stopped it "
                f"({usage[1].strip()}). Put the script's arguments after its name: "
                "python -m course_lib xray [options] script.py ARGS.")
    if any(e["kind"] in _TRAINING for events in obs.events.values() for e in events):
        return ""
    spawned = obs.of("spawn")
    if spawned and not any(e["nprocs"] for _, e in spawned):
        e = spawned[0][1]
        return (f"Nothing was launched: mp.spawn({e['fn']}, nprocs=0) at {e['where']} started "
                "no process (torch.cuda.device_count() is 0 on a CPU machine). Let the script "
                "run its training function itself when RANK is set (the x-ray starts the "
                "ranks, as torchrun does), or give nprocs a number.")
    said = obs.of("print")
    after = f", after printing {said[-1][1]['text'][:60]!r} at {said[-1][1]['where']}," \
        if said else ""
    return (f"The script did not train: {_ended(failures)}{after} before any DDP model, "
            "optimizer step, DataLoader batch or collective, so nothing could be checked. "
            "Make it reach its training loop on this machine.")


def _ended(failures: list[Any]) -> str:
    exits = [f for f in failures if f.kind == "exit"]
    if exits:
        return f"rank {exits[0].rank} {exits[0].summary}"
    if failures:
        return f"rank {failures[0].rank} failed ({failures[0].summary[:80]})"
    return "every rank ended normally"
