"""Lesson 16's measurements on real gloo ranks: which slice of each weight a rank holds, the
collectives per layer of a column-then-row plan against a gathered one (CommDebugMode and the
flight recorder agreeing), the bytes autograd saves for the loss; and the pictures drawn from
them."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)

from course_lib import launch
from course_lib.teach import tensor_parallel as tp
from course_lib.teach import tensor_parallel_views as views

IN, HIDDEN, OUT = 8, 16, 12


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT))


PAIRED = {"0": ColwiseParallel(), "2": RowwiseParallel()}
GATHERED = {"0": ColwiseParallel(output_layouts=Replicate()),
            "2": ColwiseParallel(output_layouts=Replicate())}


def step(plan):
    model = parallelize_module(mlp(), init_device_mesh("cpu", (dist.get_world_size(),)), plan)
    x = torch.randn(4, IN, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with tp.counted(model) as seen:
        out = model(x)
        out.sum().backward()
    return {"out": out.detach(), "seen": seen, "shards": tp.shards(model)}


def test_op_names_read_the_same_from_both_sources():
    assert tp.op_name("c10d_functional.all_gather_into_tensor") == "all_gather"
    assert tp.op_name("gloo:all_reduce") == "all_reduce"
    assert tp.op_name("_c10d_functional.reduce_scatter_tensor") == "reduce_scatter"


def test_a_plain_tensor_is_whole_and_counts_all_its_bytes():
    t = torch.zeros(3, 5)
    assert tp.shard_of(t) == {"shape": (3, 5), "dim": None, "start": 0, "stop": 0,
                              "placement": "whole"}
    assert tp.local_bytes(t) == 60


def test_each_rank_holds_its_rows_then_its_columns_and_the_output_is_one_process_s():
    results = launch(step, 4, args=(PAIRED,), backend="gloo", echo=False).results
    with torch.no_grad():
        want = mlp()(torch.randn(4, IN, generator=torch.Generator().manual_seed(1)))
    for rank, result in enumerate(results):
        assert torch.allclose(result["out"], want, atol=1e-6)
        up, down = result["shards"]["0.weight"], result["shards"]["2.weight"]
        assert (up["dim"], up["start"], up["stop"]) == (0, 4 * rank, 4 * rank + 4)
        assert (down["dim"], down["start"], down["stop"]) == (1, 4 * rank, 4 * rank + 4)
        assert up["shape"] == (HIDDEN, IN) and down["shape"] == (OUT, HIDDEN)


def test_column_then_row_costs_one_all_reduce_per_pass_and_gathering_four_collectives():
    paired = launch(step, 2, args=(PAIRED,), backend="gloo", echo=False).results[0]["seen"]
    assert paired.layers() == {"2": {"forward": {"all_reduce": 1}, "backward": {}},
                               "0": {"forward": {}, "backward": {"all_reduce": 1}}}
    assert [(c["op"], c["sizes"]) for c in paired.wire] == [("all_reduce", [(4, OUT)]),
                                                            ("all_reduce", [(4, IN)])]
    assert paired.wire[0]["bytes"] == 4 * OUT * 4
    gathered = launch(step, 2, args=(GATHERED,), backend="gloo", echo=False).results[0]["seen"]
    assert gathered.total(("forward",)) == 2 and gathered.total(("backward",)) == 2
    assert [c["op"] for c in gathered.wire] == ["all_gather", "all_gather", "all_reduce",
                                                "all_reduce"]
    assert len(gathered.wire) == gathered.total()  # the recorder saw what CommDebugMode counted


def loss_memory(parallel):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    head = nn.Linear(IN, 64)
    style = (ColwiseParallel(use_local_output=False) if parallel
             else ColwiseParallel(output_layouts=Replicate()))
    head = parallelize_module(head, mesh, style)
    logits = head(torch.randn(32, IN, generator=torch.Generator().manual_seed(1)))
    targets = torch.randint(0, 64, (32,), generator=torch.Generator().manual_seed(2))
    with tp.saved_bytes() as saved, loss_parallel():
        F.cross_entropy(logits, targets).backward()
    return {"logits": tp.local_bytes(logits), "saved": saved["saved"]}


def test_loss_parallel_holds_and_saves_a_share_of_the_logits():
    gathered = launch(loss_memory, 2, args=(False,), backend="gloo", echo=False).results[0]
    sharded = launch(loss_memory, 2, args=(True,), backend="gloo", echo=False).results[0]
    full = 32 * 64 * 4
    assert gathered["logits"] == full and sharded["logits"] == full // 2
    assert gathered["saved"] >= full  # cross_entropy's log-softmax of every logit
    assert full // 2 <= sharded["saved"] < full  # its share, and a few small tensors


def test_pictures_draw_what_the_ranks_measured():
    results = launch(step, 2, args=(PAIRED,), backend="gloo", echo=False).results
    fig = views.plot_shards([r["shards"] for r in results], "shards")
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == ["0.weight", "2.weight"]
    fig = views.plot_collectives({"paired": results[0]["seen"]}, "collectives")
    assert "1 in forward, 1 in backward" in fig.axes[0].get_title()
    fig = views.plot_outputs([r["out"] for r in results], results[0]["out"], "outputs")
    assert "largest difference 0" in fig.axes[0].get_title()
    fig = views.plot_per_rank({"a": [1.0, 2.0]}, 1.0, ylabel="loss", title="t")
    edges = [p.get_edgecolor() for p in fig.axes[0].patches]
    assert edges[0] != edges[1]  # the rank off the one-process line is marked
    samples = [{"samples": [0, 2], "seed": 7}, {"samples": [1, 3], "seed": 8}] * 2
    fig = views.plot_mesh_samples({"run": samples}, (2, 2), "mesh")
    assert len(fig.axes[0].patches) == 4


def test_plot_per_rank_refuses_an_unknown_problem_kind():
    with pytest.raises(ValueError, match="off the line"):
        views.plot_per_rank({"a": [1.0]}, 1.0, ylabel="x", title="t", problem="higher")
