"""The mixed-precision teaching module: fp16's smallest value is where values vanish, the
recorders see the dtypes that really ran and were really sent, and the figures draw what
they are given."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach.mixed_precision import (
    FP16_TINY,
    autocast_ops,
    magnitudes,
    nonzero_share,
    op_table,
    plot_grad_histograms,
    plot_losses,
    plot_scale,
    sent,
    underflow_explorer,
    underflow_sweep,
)


def test_fp16_tiny_is_the_smallest_value_fp16_holds():
    assert FP16_TINY == 2.0**-24
    assert torch.tensor(FP16_TINY).half().item() == FP16_TINY
    assert torch.tensor(FP16_TINY * 0.49).half().item() == 0.0


def test_magnitudes_counts_missing_gradients_as_zeros():
    model = nn.Linear(3, 2)
    model.weight.grad = -torch.ones(2, 3)
    grads = magnitudes(model)
    assert grads.tolist() == [1.0] * 6 + [0.0, 0.0]
    assert nonzero_share(grads) == 0.75
    assert nonzero_share(torch.zeros(0)) == 0.0


def test_autocast_ops_sees_the_dtypes_autocast_chose():
    model, x = nn.Linear(4, 3), torch.randn(5, 4)
    with autocast_ops() as ops, torch.autocast("cpu", dtype=torch.float16):
        nn.functional.mse_loss(model(x), torch.zeros(5, 3))
    ran = {op.name: op.output for op in ops}
    assert ran["addmm"] == "float16" and ran["mse_loss"] == "float32"
    assert "_to_copy" in ran  # the casts autocast inserted
    table = op_table(ops)
    assert "addmm" in table and "low precision" in table and "_to_copy, that autocast" in table
    assert "\n_to_copy" not in table  # casts are counted, not listed


def test_autocast_ops_without_autocast_sees_fp32():
    with autocast_ops() as ops:
        nn.Linear(4, 3)(torch.randn(2, 4))
    assert {op.output for op in ops if op.name == "addmm"} == {"float32"}


def _sent_by_ddp(hook):
    model = DDP(nn.Linear(8, 4))
    model.register_comm_hook(None, hook)
    before = dist.all_reduce
    with sent() as calls:
        model(torch.randn(2, 8)).sum().backward()
    return [(c.dtype, c.nbytes) for c in calls], dist.all_reduce is before


def test_sent_records_what_ddp_all_reduces():
    for hook, want in ((default_hooks.allreduce_hook, [("float32", 36 * 4)]),
                       (default_hooks.fp16_compress_hook, [("float16", 36 * 2)])):
        for calls, restored in launch(_sent_by_ddp, 2, args=(hook,), echo=False).results:
            assert calls == want and restored


def test_figures_draw_what_they_are_given():
    g = torch.tensor([0.0, 1e-10, 1e-9, 1e-6])
    fig = plot_grad_histograms({"a": [g, g], "b": [torch.zeros(4), torch.zeros(4)]})
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "a"
    assert "rank 1: 75% non-zero" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(plot_losses({"x": [1.0, 0.5], "y": [1.0, 1.0]}).axes[0].lines) == 2
    fig = plot_scale({0: [4.0, 2.0, 2.0]}, {0: [0]})
    xs, ys = fig.axes[0].lines[1].get_data()
    assert list(xs) == [0] and list(ys) == [4.0]


def test_underflow_sweep_loses_fp16_gradients_only_without_a_scaler():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    grid = underflow_sweep(model, x, y, [1.0, 1e-7])
    share = {w: {name: nonzero_share(g) for name, g in row.items()} for w, row in grid.items()}
    assert share[1.0]["fp16, no scaler"] == share[1.0]["fp32"] == 1.0
    assert share[1e-7]["fp16, no scaler"] < 0.05
    assert share[1e-7]["fp16 + GradScaler (x65536)"] == share[1e-7]["bf16, no scaler"] == 1.0
    scaled, fp32 = grid[1.0]["fp16 + GradScaler (x65536)"], grid[1.0]["fp32"]
    assert (scaled - fp32).norm() / fp32.norm() < 1e-2  # unscaled back to the true size
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert underflow_explorer(grid).children[0].description == "loss weight"
