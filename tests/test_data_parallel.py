"""course_lib.teach.data_parallel: the hand-written, the bucketed and PyTorch's data
parallelism train exactly as one process does on the whole batch, at 2 and 3 ranks."""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib import launch
from course_lib.checks.collectives import count, recorded
from course_lib.teach.data_parallel import (
    WRAPPERS,
    BucketedDataParallel,
    NaiveDataParallel,
    finish_gradient_sync,
    make_buckets,
)

STEPS, LR, BATCH = 3, 0.1, 12  # BATCH splits evenly over 2 and 3 ranks
CAP_MB = 300 / 2**20  # 300 bytes: the 8x8 layer's weight (256 bytes) fills a bucket alone


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 2))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(BATCH, 4, generator=g), torch.randn(BATCH, 2, generator=g)


def baseline() -> dict[str, torch.Tensor]:
    """One process, the whole batch, plain SGD."""
    model = net(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = batch()
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_each_way(micro_steps: int = 1) -> dict[str, dict]:
    """On every rank: each wrapper trains its own model on this rank's share of the batch,
    in `micro_steps` micro-batches (all but the last inside no_sync()). Each rank starts
    from a different seed: the wrappers must give all rank 0's weights."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (t.chunk(world)[rank] for t in batch())
    out = {}
    for name, wrap in WRAPPERS.items():
        options = {} if name == "naive" else {"bucket_cap_mb": CAP_MB}
        model = wrap(net(seed=0 if rank == 0 else 100 + rank), **options)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        launched, calls = [], 0
        for _ in range(STEPS):
            opt.zero_grad()
            with recorded() as seen:
                for i, (xs, ys) in enumerate(zip(x.chunk(micro_steps), y.chunk(micro_steps))):
                    last = i == micro_steps - 1
                    with nullcontext() if last else model.no_sync():  # forward inside too
                        (nn.functional.mse_loss(model(xs), ys) / micro_steps).backward()
                if isinstance(model, BucketedDataParallel):
                    launched.append((model.launched(), len(model.buckets)))
                finish_gradient_sync(model)
            calls = count(seen)
            opt.step()
        state = getattr(model, "module", model).state_dict()
        out[name] = {"state": {k: v.detach().clone() for k, v in state.items()},
                     "launched": launched, "calls": calls}
    return out


@pytest.mark.parametrize("world_size, micro_steps", [(2, 1), (3, 1), (2, 2), (3, 2)])
def test_all_three_match_one_process(world_size, micro_steps):
    """With and without gradient accumulation (micro_steps 2: a no_sync() backward first)."""
    want = baseline()
    results = launch(train_each_way, world_size, args=(micro_steps,), backend="gloo",
                     timeout=120).results
    for rank, by_name in enumerate(results):
        for name, got in by_name.items():
            for key, value in want.items():
                assert torch.allclose(got["state"][key], value, rtol=1e-4, atol=1e-6), \
                    f"{name} on rank {rank} of {world_size}: {key} differs from one process"
        assert by_name["naive"]["calls"] == 6  # one per parameter tensor, per optimizer step
        # every bucket started its all-reduce inside backward, before the sync was asked for
        launched = by_name["bucketed"]["launched"]
        assert len(launched) == STEPS and all(started == total > 1 for started, total in launched)


def test_buckets_fill_in_backward_order_and_close_at_the_cap():
    """DDP's rule: a bucket closes once it holds the cap or more (so it can end a little
    over it); only the last may hold less."""
    params = list(net(seed=0).parameters())
    buckets = make_buckets(params, cap_bytes=300)
    assert [p for b in buckets for p in b.params] == params[::-1]
    sizes = [sum(p.numel() * 4 for p in b.params) for b in buckets]
    assert len(buckets) > 1 and all(s >= 300 for s in sizes[:-1])
    assert all(s - b.params[-1].numel() * 4 < 300 for s, b in zip(sizes, buckets))


def unused_parameter_errors() -> dict[str, str]:
    """A model with a layer the loss never uses: both hand-written wrappers refuse to wait."""
    messages = {}
    for wrap in (NaiveDataParallel, BucketedDataParallel):
        torch.manual_seed(0)
        model = wrap(nn.ModuleDict({"used": nn.Linear(2, 1), "spare": nn.Linear(2, 1)}))
        model.module["used"](torch.ones(3, 2)).sum().backward()
        try:
            finish_gradient_sync(model)
        except RuntimeError as exc:
            messages[wrap.__name__] = str(exc)
    return messages


def backward_twice_without_sync() -> str:
    model = BucketedDataParallel(nn.Linear(2, 1))
    model(torch.ones(3, 2)).sum().backward()
    try:
        model(torch.ones(3, 2)).sum().backward()  # no finish_gradient_sync() in between
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_a_second_backward_before_the_sync_is_refused():
    message = launch(backward_twice_without_sync, 2, backend="gloo").results[0]
    assert message.startswith("backward() ran again before finish_gradient_sync()"), message


def test_a_parameter_without_gradient_is_named():
    messages = launch(unused_parameter_errors, 2, backend="gloo").results[0]
    assert set(messages) == {"NaiveDataParallel", "BucketedDataParallel"}
    assert all(m.startswith("spare.") and "find_unused_parameters" in m
               for m in messages.values()), messages


def test_finish_gradient_sync_refuses_a_plain_model():
    with pytest.raises(TypeError, match="got Linear"):
        finish_gradient_sync(nn.Linear(2, 1))
