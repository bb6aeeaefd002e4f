"""Record every all-reduce DDP issues, with its bucket's gradients before and after it.

A DDP comm hook receives each bucket when its gradients are ready and returns a Future of
the reduced bucket. Ours runs DDP's default all-reduce (or the learner's hook): it notes
the bucket and its gradients, starts the all-reduce, and notes the end and the reduced
gradients when the Future completes. On gloo that is on the communication thread, once
the all-reduce is done, so the clock's time is real. On a GPU the Future completes as soon
as the all-reduce is queued, and its callback runs on a stream that waits for it
(torch/futures/__init__.py, Future.then): start and end are CUDA events there
(devices.timestamp), read when the telemetry is collected; waiting in the callback would
hold up backward and hide the very overlap the timeline shows.
No `from __future__ import annotations` here: DDP checks the hook's annotations at runtime.
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from course_lib import devices
from course_lib.telemetry.clock import now
from course_lib.telemetry.grads import parameter_names
from course_lib.telemetry.host import RecordHost


def watch(rec: RecordHost, ddp_model: DistributedDataParallel, hook: Callable | None,
          state: Any, grads: bool) -> None:
    """Register a comm hook on `ddp_model` that records into `rec`."""
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"watch_ddp() needs a DistributedDataParallel model, got "
                        f"{type(ddp_model).__name__}")
    names = parameter_names(ddp_model.module)
    inner = hook or _average
    devices.start_gpu_clock(now)  # on a GPU: its one synchronize, before training

    def recording_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        step, index, flat = rec.current_step, bucket.index(), bucket.buffer()
        layout = rec.layout(bucket.parameters(), names) if grads else None
        if grads:
            rec.record_grads(step, "before", index, flat, layout)
        nbytes, start = flat.numel() * flat.element_size(), devices.timestamp(now)

        def finished(fut: torch.futures.Future) -> torch.Tensor:
            reduced = fut.value()
            reduced = reduced[0] if isinstance(reduced, list) else reduced
            rec.record_row("comms", step, "allreduce", index, nbytes, start,
                           devices.timestamp(now))
            if grads:
                rec.record_grads(step, "after", index, reduced, layout)
            return reduced

        return inner(state, bucket).then(finished)

    ddp_model.register_comm_hook(state, recording_hook)


def _average(state: Any, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP's default: divide by the world size, then all-reduce (sum) in place; `state` is
    the process group (None: the default one). The arithmetic of default_hooks.allreduce_hook
    without its extra Python callback."""
    tensor = bucket.buffer().div_(dist.get_world_size(state))
    return dist.all_reduce(tensor, group=state, async_op=True).get_future()
