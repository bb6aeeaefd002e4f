"""The rank side of the desync report: dump PyTorch's flight recorder to a file.

With TORCH_FR_BUFFER_SIZE set before init_process_group, torch 2.13 records every gloo
collective (name, input sizes, sequence number, the Python frames that issued it). A rank
dumps it when the function returns or raises, and when the launcher stops it (at a timeout,
or when another rank failed): then the rank record's signal thread (rank_record.start)
dumps it while the main thread is still blocked in a collective (measured, see
docs/facts.md).
"""

from __future__ import annotations

import os
import threading

import torch

BUFFER_SIZE = "256"  # collectives kept per rank; the report shows the last few


def enabled() -> bool:
    """True when this process records collectives (the variable is read at group creation)."""
    return bool(os.environ.get("TORCH_FR_BUFFER_SIZE"))


def dump(path: str) -> None:
    """Write the recorder's pickled trace to `path` atomically (the kernel unpickles it
    only when the launch fails). Never raises: the report is a help, not the result."""
    try:
        data = torch._C._distributed_c10d._dump_fr_trace()  # type: ignore[attr-defined]
        tmp = f"{path}.{threading.get_ident()}.tmp"  # the watcher and the main thread apart
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except Exception:  # noqa: BLE001 - no group yet, or a full disk: the report says "no dump"
        pass
