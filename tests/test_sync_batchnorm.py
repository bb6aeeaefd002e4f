"""The CPU SyncBatchNorm equals BatchNorm on the global batch (all ranks' samples together):
outputs, input gradients, weight and bias gradients and running statistics, through real
2- and 3-rank launches, with unequal per-rank batch sizes."""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach.sync_batchnorm import SyncBatchNorm

CHANNELS = 3
STEPS = 3
SEED = 11


def global_batch(sizes, tail, step, dtype):
    """The global batch of one step: every rank builds the same one and takes its rows.
    Unequal scales and offsets per channel; in float64 a large offset too, which a naive
    variance (mean of squares minus squared mean, in float32) would get wrong."""
    gen = torch.Generator().manual_seed(SEED + step)
    shape = (sum(sizes), CHANNELS, *tail)
    view = (1, CHANNELS, *([1] * len(tail)))
    scale = torch.tensor([0.5, 2.0, 7.0], dtype=torch.float64).view(view)
    offset = (100.0 if dtype == torch.float64 else 1.0) * torch.tensor(
        [1.0, -2.0, 0.5], dtype=torch.float64).view(view)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset
    weights = torch.randn(shape, generator=gen, dtype=torch.float64)  # loss = (out * w).sum()
    return x.to(dtype), weights.to(dtype)


def rows(sizes, rank):
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def new_layer(cls, momentum, dtype=torch.float32):
    torch.manual_seed(SEED)
    layer = cls(CHANNELS, momentum=momentum, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(CHANNELS) + 0.5)
        layer.bias.copy_(torch.randn(CHANNELS))
    return layer


def train_steps(layer, sizes, tail, rank):
    """Forward and backward of STEPS global batches; this rank's part of every result."""
    outs = []
    for step in range(STEPS):
        x, weights = global_batch(sizes, tail, step, layer.weight.dtype)
        x, weights = x[rows(sizes, rank)].clone().requires_grad_(), weights[rows(sizes, rank)]
        out = layer(x)
        (out * weights).sum().backward()
        outs.append({"out": out.detach(), "x_grad": x.grad,
                     "weight_grad": layer.weight.grad.clone(),
                     "bias_grad": layer.bias.grad.clone()})
        layer.zero_grad()
    buffers = {k: v.clone() for k, v in layer.named_buffers()}
    return outs, buffers


def on_rank(sizes, tail, momentum, dtype):
    layer = new_layer(SyncBatchNorm, momentum, dtype)
    return train_steps(layer, sizes, tail, dist.get_rank())


def reference(sizes, tail, momentum, dtype=torch.float32):
    """BatchNorm on one process, on the whole global batch."""
    layer = new_layer(nn.BatchNorm1d if not tail else nn.BatchNorm2d, momentum, dtype)
    return train_steps(layer, [sum(sizes)], tail, 0)


def assert_close(got, want, what):
    tol = 1e-10 if want.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("sizes, tail, momentum, dtype", [
    ([4, 4], (), 0.1, torch.float32),          # 2 ranks, (N, C) inputs
    ([2, 7], (), None, torch.float64),         # unequal batches; cumulative running average
    ([3, 1, 6], (2, 3), 0.3, torch.float64),   # 3 ranks, (N, C, H, W), a one-sample rank
    ([3, 1, 6], (2, 3), 0.3, torch.float32),
    ([5, 0, 2], (), 0.1, torch.float64),       # a rank with no sample at all
])
def test_equals_batchnorm_on_the_global_batch(sizes, tail, momentum, dtype):
    results = launch(on_rank, len(sizes), args=(sizes, tail, momentum, dtype),
                     backend="gloo", echo=False).results
    want, want_buffers = reference(sizes, tail, momentum, dtype)
    for step in range(STEPS):
        for rank, (outs, _) in enumerate(results):
            got, part = outs[step], rows(sizes, rank)
            assert_close(got["out"], want[step]["out"][part], f"step {step} rank {rank} output")
            assert_close(got["x_grad"], want[step]["x_grad"][part],
                         f"step {step} rank {rank} input gradient")
        # Each rank's weight/bias gradient is its own loss's; together they are the global one.
        for name in ("weight_grad", "bias_grad"):
            total = sum(outs[step][name] for outs, _ in results)
            assert_close(total, want[step][name], f"step {step} {name} summed over ranks")
    for rank, (_, buffers) in enumerate(results):
        for name, value in want_buffers.items():
            assert_close(buffers[name], value, f"rank {rank} {name}")


def ddp_on_rank(sizes):
    """Linear -> SyncBatchNorm -> Linear under DDP: DDP averages every gradient."""
    model = small_net(SyncBatchNorm)
    ddp = DDP(model)
    x, weights = net_batch(sizes)
    part = rows(sizes, dist.get_rank())
    (ddp(x[part]) * weights[part]).sum().backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}, \
        {k: b.clone() for k, b in model.named_buffers()}


def small_net(norm):
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(4, CHANNELS), norm(CHANNELS), nn.ReLU(), nn.Linear(CHANNELS, 2))


def net_batch(sizes):
    gen = torch.Generator().manual_seed(SEED)
    return torch.randn(sum(sizes), 4, generator=gen), torch.randn(sum(sizes), 2, generator=gen)


def test_under_ddp_the_averaged_gradients_are_the_global_batchs():
    sizes = [3, 6, 4]
    results = launch(ddp_on_rank, len(sizes), args=(sizes,), backend="gloo", echo=False).results
    model = small_net(nn.BatchNorm1d)
    x, weights = net_batch(sizes)
    (model(x) * weights).sum().backward()
    for rank, (grads, buffers) in enumerate(results):
        for name, p in model.named_parameters():
            # DDP divides the sum over ranks by the world size.
            assert_close(grads[name], p.grad / len(sizes), f"rank {rank} {name}.grad")
        for name, b in model.named_buffers():
            assert_close(buffers[name], b, f"rank {rank} {name}")


class HiddenCollective(SyncBatchNorm):
    """The control: an eval forward that communicates, which the test below must catch."""

    def forward(self, input):
        if not self.training:
            dist.all_reduce(torch.zeros(1))
        return super().forward(input)


def eval_on_rank_0_only(cls):
    """Rank 0 evaluates alone: rank 1 never calls the layer and leaves, so a collective in
    the eval forward has no partner and fails (within the 2 s pg_timeout at the latest)."""
    if dist.get_rank() != 0:
        return None
    layer = new_layer(cls, 0.1)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -2.0, 3.0]))
        layer.running_var.copy_(torch.tensor([4.0, 0.5, 2.0]))
    x = torch.randn(5, CHANNELS)
    return x, layer.eval()(x)


def launch_eval(cls):
    return launch(eval_on_rank_0_only, 2, args=(cls,), backend="gloo", pg_timeout=2,
                  timeout=30, echo=False)


def test_eval_mode_uses_the_running_statistics_without_communicating():
    x, out = launch_eval(SyncBatchNorm).results[0]
    layer = new_layer(nn.BatchNorm1d, 0.1)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([1.0, -2.0, 3.0]))
        layer.running_var.copy_(torch.tensor([4.0, 0.5, 2.0]))
    assert_close(out, layer.eval()(x), "eval output")


def test_a_collective_hidden_in_eval_mode_would_be_caught():
    from course_lib import DistributedError

    with pytest.raises(DistributedError) as caught:
        launch_eval(HiddenCollective)
    assert caught.value.failures[0].rank == 0


def test_without_a_process_group_it_is_batchnorm():
    sizes, tail = [6], (2, 2)
    got, got_buffers = train_steps(new_layer(SyncBatchNorm, 0.1), sizes, tail, 0)
    want, want_buffers = reference(sizes, tail, 0.1)
    for step in range(STEPS):
        for key in want[step]:
            assert_close(got[step][key], want[step][key], f"step {step} {key}")
    for name in want_buffers:
        assert_close(got_buffers[name], want_buffers[name], name)


def test_convert_keeps_parameters_and_buffers():
    model = nn.Sequential(nn.Conv2d(1, CHANNELS, 3), nn.BatchNorm2d(CHANNELS),
                          nn.Sequential(nn.Flatten(), nn.BatchNorm1d(CHANNELS * 4)))
    old = [model[1].weight, model[1].running_mean, model[2][1].bias, model[2][1].running_var]
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], SyncBatchNorm) and isinstance(converted[2][1], SyncBatchNorm)
    new = [converted[1].weight, converted[1].running_mean, converted[2][1].bias,
           converted[2][1].running_var]
    assert all(a is b for a, b in zip(old, new))


def one_sample_in_total():
    layer = SyncBatchNorm(CHANNELS)
    x = torch.randn(1 if dist.get_rank() == 0 else 0, CHANNELS)
    layer(x)


def test_a_global_batch_of_one_sample_is_refused_like_batchnorm():
    from course_lib import DistributedError

    with pytest.raises(DistributedError, match="Expected more than 1 value per channel"):
        launch(one_sample_in_total, 2, backend="gloo", echo=False)


def test_plot_normalisation_compares_each_rank_with_the_whole_batch():
    from course_lib.teach.sync_batchnorm import plot_normalisation

    x = torch.randn(8, CHANNELS)
    shares = [(x[:4], nn.functional.batch_norm(x[:4], None, None, training=True)),
              (x[4:], nn.functional.batch_norm(x[4:], None, None, training=True))]
    stats, outputs = plot_normalisation(shares, "per rank").axes
    assert [t.get_text() for t in stats.get_legend().get_texts()] == \
        ["rank 0's rows", "rank 1's rows", "whole batch"]
    assert [t.get_text() for t in outputs.get_legend().get_texts()] == \
        ["rank 0", "rank 1", "same as one process"]
