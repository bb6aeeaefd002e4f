"""The rank side of the desync report: dump PyTorch's flight recorder to a file.

torch 2.13 records every gloo collective in it by default (name, input sizes, sequence
number, the Python frames that issued it): the last 2000, or as many as
TORCH_FR_BUFFER_SIZE says when init_process_group runs, 0 turning it off (measured with 2
gloo ranks: unset 3 of 3 all-reduces, "0" none, "2000" 3). With desync_report, launch()
keeps the last BUFFER_SIZE and a rank dumps them when its function returns or raises, and
when the launcher stops it (at a timeout, or when another rank failed): then the rank
record's signal thread (rank_record.start) dumps them while the main thread is still
blocked in a collective (measured, see docs/facts.md).
"""

from __future__ import annotations

import os
import threading

import torch

BUFFER_SIZE = "256"  # collectives kept per rank; the report shows the last few


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
