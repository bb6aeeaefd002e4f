"""Data parallelism three ways, side by side: by hand, bucketed, and PyTorch's DDP.

    model = NaiveDataParallel(net)       # one all-reduce per parameter, after backward
    model = BucketedDataParallel(net)    # hooks fill flat buckets; each all-reduce starts
                                         # during backward, as soon as its bucket is full
    model = ddp(net)                     # torch.nn.parallel.DistributedDataParallel
    loss_fn(model(x), y).backward()
    finish_gradient_sync(model)          # the first two wait here; DDP already has
    opt.step()

Gradient accumulation: each has `no_sync()`. Inside it the hand-written two skip their
all-reduces at backward time. DDP decides at *forward* time (_post_forward calls
prepare_for_backward only when require_backward_grad_sync is set: torch 2.13,
torch/nn/parallel/distributed.py:1828), so its forward must be inside no_sync() too.

All three leave every rank with the same gradients: the mean over ranks of each rank's own
gradients. The first two are written to be read from top to bottom (picotron keeps
`DataParallelNaive` beside `DataParallelBucket` for the same reason). DDP does the same in
C++ (torch/csrc/distributed/c10d/reducer.cpp), with more care: it re-orders its buckets
after the first step, can keep the gradients as views into its buckets
(gradient_as_bucket_view=True), and finds unused parameters when asked. Lesson 01 writes the
naive loop inline and points here; lesson 04 counts the three's all-reduces (calls, bytes,
started inside backward) and times them; lesson 07 counts them under no_sync();
benchmarks/data_parallel.py times them side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# DDP's bucket size when bucket_cap_mb is left out (torch/nn/parallel/distributed.py:31,
# _DEFAULT_BUCKET_CAP_MB). Passed explicitly, as ddp() below does, it applies to DDP's first
# bucket too (left out, the first bucket is 1 MiB): the three then bucket alike.
BUCKET_CAP_MB = 25.0


def broadcast_from_rank0(module: nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers, as DDP's constructor does, so that
    all ranks start from the same model whatever seed each one used."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor, src=0)


def _trained(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


class _Wrapper(nn.Module):
    """What the two hand-written wrappers share: the model, rank 0's weights everywhere,
    and DDP's switch for gradient accumulation."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # DDP's name for the same switch
        broadcast_from_rank0(module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate into param.grad on this rank: no
        all-reduce until a backward outside it (then the sum of them all is averaged)."""
        before, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before


# -- 1. by hand ---------------------------------------------------------------------------


class NaiveDataParallel(_Wrapper):
    """The simplest correct data parallelism: after backward, one all-reduce per parameter.

    Each all-reduce waits for the one before and none starts until backward has finished,
    so communication never overlaps computation, and a model with many small parameters
    pays the per-call latency many times.
    """

    def finish_gradient_sync(self) -> None:
        """Average every gradient over the ranks: sum with all_reduce, divide by the size
        (nothing inside no_sync())."""
        if not self.require_backward_grad_sync:
            return
        world_size = dist.get_world_size()
        for p in _trained(self.module):
            if p.grad is None:
                raise RuntimeError(_no_grad_message(self.module, p))
            dist.all_reduce(p.grad)  # SUM, in place
            p.grad.div_(world_size)


# -- 2. bucketed, overlapped with backward --------------------------------------------------


class _Bucket:
    """A few parameters whose gradients travel together in one flat tensor."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                                device=params[0].device)
        self.offsets: dict[nn.Parameter, int] = {}
        offset = 0
        for p in params:
            self.offsets[p] = offset
            offset += p.numel()
        self.ready: set[nn.Parameter] = set()
        self.work: dist.Work | None = None

    def slot(self, p: nn.Parameter) -> torch.Tensor:
        """The part of the flat tensor that holds p's gradient, shaped like p."""
        start = self.offsets[p]
        return self.flat[start:start + p.numel()].view_as(p)


def make_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[_Bucket]:
    """Group parameters into buckets in reverse order of definition (backward produces the
    last layer's gradients first, so the first bucket fills first), closing a bucket once it
    holds `cap_bytes` or more: DDP's rule, so a bucket can end a little over the cap. (DDP
    then re-orders its buckets by the order gradients arrived in its first backward.)"""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        if current and p.dtype != current[0].dtype:  # one flat tensor has one dtype
            buckets.append(_Bucket(current))
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:
            buckets.append(_Bucket(current))
            current, size = [], 0
    if current:
        buckets.append(_Bucket(current))
    return buckets


class BucketedDataParallel(_Wrapper):
    """Gradient hooks copy each gradient into its bucket the moment autograd has
    accumulated it; a full bucket starts its all-reduce at once (async_op=True) and
    backward goes on computing the earlier layers meanwhile. finish_gradient_sync() waits
    for every bucket and copies the averaged gradients back into `param.grad`."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = BUCKET_CAP_MB) -> None:
        super().__init__(module)
        cap_bytes = max(1, int(bucket_cap_mb * 1024 * 1024))
        self.buckets = make_buckets(_trained(module), cap_bytes)
        self._bucket_of = {p: b for b in self.buckets for p in b.params}
        for p in self._bucket_of:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p: nn.Parameter) -> None:
        """Runs inside backward, once p.grad holds this backward's gradient (added to what
        earlier backwards inside no_sync() left there)."""
        if not self.require_backward_grad_sync:
            return
        bucket = self._bucket_of[p]
        if bucket.work is not None:
            raise RuntimeError(
                "backward() ran again before finish_gradient_sync() of the one before: "
                "its all-reduce still uses the bucket. Call finish_gradient_sync() after "
                "every backward() outside no_sync(); to accumulate, run the earlier "
                "backwards inside no_sync().")
        bucket.slot(p).copy_(p.grad)
        bucket.ready.add(p)
        if len(bucket.ready) == len(bucket.params):
            bucket.work = dist.all_reduce(bucket.flat, async_op=True)

    def launched(self) -> int:
        """How many buckets have started their all-reduce since the last sync."""
        return sum(b.work is not None for b in self.buckets)

    def finish_gradient_sync(self) -> None:
        """Wait for every bucket's all-reduce, then write the averages into param.grad
        (nothing inside no_sync())."""
        if not self.require_backward_grad_sync:
            return
        world_size = dist.get_world_size()
        for bucket in self.buckets:
            if bucket.work is None:
                missing = next(p for p in bucket.params if p not in bucket.ready)
                raise RuntimeError(_no_grad_message(self.module, missing))
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.div_(world_size)
            for p in bucket.params:
                p.grad.copy_(bucket.slot(p))
            bucket.ready.clear()
            bucket.work = None


def _no_grad_message(module: nn.Module, p: nn.Parameter) -> str:
    name = next((n for n, q in module.named_parameters() if q is p), "a parameter")
    return (f"{name} got no gradient in this backward: it did not take part in the loss. "
            "Every rank must all-reduce the same tensors, so a parameter without a "
            "gradient would leave the others waiting. Use it in forward, set "
            "requires_grad=False on it, or use DDP with find_unused_parameters=True.")


# -- 3. PyTorch's own ---------------------------------------------------------------------


def ddp(module: nn.Module, bucket_cap_mb: float = BUCKET_CAP_MB) -> DistributedDataParallel:
    """torch.nn.parallel.DistributedDataParallel with the same bucket size as above."""
    return DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)


def finish_gradient_sync(model: nn.Module) -> None:
    """Wait until every rank holds the averaged gradients. A no-op for DDP: its backward()
    returns with the gradients averaged already (tests/test_data_parallel.py shows it)."""
    if isinstance(model, (NaiveDataParallel, BucketedDataParallel)):
        model.finish_gradient_sync()
    elif not isinstance(model, DistributedDataParallel):
        raise TypeError(f"finish_gradient_sync() needs one of this module's wrappers or "
                        f"DistributedDataParallel, got {type(model).__name__}")


# name -> how to wrap a model: what the benchmark and the lessons iterate over
WRAPPERS = {"naive": NaiveDataParallel, "bucketed": BucketedDataParallel, "ddp": ddp}
