"""course_lib.teach.placement: per-rank snapshots of what is on which device, and the
diagnosis that compares them (within a rank, and across ranks)."""

import pickle

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import launch
from course_lib.teach import placement, placement_views


def as_rank(monkeypatch, rank, local_rank=None, node=0):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(rank if local_rank is None else local_rank))
    monkeypatch.setenv("GROUP_RANK", str(node))


def model():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))


def test_a_snapshot_is_plain_data_naming_every_item(monkeypatch):
    as_rank(monkeypatch, 1)
    weighted = nn.CrossEntropyLoss(weight=torch.ones(4))
    snap = placement.snapshot(model().to("meta"), device="meta", inputs=torch.zeros(2, 3),
                              batch={"a": torch.zeros(1), "b": [torch.zeros(1, device="meta")]},
                              loss_fn=weighted, plain=nn.MSELoss())
    assert pickle.loads(pickle.dumps(snap)) == snap  # travels back from a rank as is
    assert snap["rank"] == 1 and snap["local_rank"] == 1 and snap["node"] == 0
    assert snap["device"] == "meta"
    items = {it["name"]: it for it in snap["items"]}
    assert items["model parameters"] == {"name": "model parameters", "devices": {"meta": 4},
                                         "count": 4}
    assert items["model buffers"]["devices"] == {"meta": 3}  # running mean, var, count
    assert items["inputs"]["devices"] == {"cpu": 1}
    assert items["batch"]["devices"] == {"cpu": 1, "meta": 1}
    assert items["loss_fn buffers"]["devices"] == {"cpu": 1}
    assert items["plain"] == {"name": "plain", "devices": {}, "count": 0}  # nothing to move


def test_a_healthy_placement_has_no_problems(monkeypatch):
    snaps = []
    for rank in range(2):
        as_rank(monkeypatch, rank)
        snaps.append(placement.snapshot(model(), device="cpu", inputs=torch.zeros(2, 3)))
    diagnosis = placement.diagnose(snaps)
    assert diagnosis.ok and diagnosis.problems == []
    assert diagnosis.expected == {0: "cpu", 1: "cpu"}
    assert "✔ every tensor is on its rank's device" in diagnosis.table()


def test_misplaced_items_are_marked_and_grouped_over_ranks(monkeypatch):
    snaps = []
    for rank in range(2):
        as_rank(monkeypatch, rank)
        snaps.append(placement.snapshot(model().to("meta"), device="meta",
                                        inputs=torch.zeros(2, 3, device="meta"),
                                        targets=torch.zeros(2)))
    diagnosis = placement.diagnose(snaps)
    assert not diagnosis.ok
    assert diagnosis.misplaced == [(0, "targets", "cpu"), (1, "targets", "cpu")]
    assert diagnosis.problems == ["ranks 0, 1: targets on cpu, not on the rank's device meta: "
                                  "move them with .to(device), or, for a tensor a model keeps, "
                                  "register_buffer it so that model.to() moves it"]
    rows = {line.split()[0]: line for line in diagnosis.table().splitlines() if line}
    assert rows["targets"].split() == ["targets", "cpu", "✗", "cpu", "✗"]
    assert "✗" not in rows["inputs"]


def test_without_a_chosen_device_the_model_sets_the_expected_one(monkeypatch):
    as_rank(monkeypatch, 0)
    snap = placement.snapshot(model().to("meta"), inputs=torch.zeros(2, 3))
    diagnosis = placement.diagnose([snap])
    assert diagnosis.expected == {0: "meta"}
    assert diagnosis.misplaced == [(0, "inputs", "cpu")]


def test_a_model_split_over_devices_is_reported(monkeypatch):
    as_rank(monkeypatch, 0)
    m = model()
    m[1].to("meta")
    diagnosis = placement.diagnose([placement.snapshot(m)])
    assert diagnosis.split[0][:2] == (0, "model parameters")
    assert "model parameters are split over devices (cpu (2), meta (2))" in diagnosis.problems[0]


def test_ranks_sharing_a_gpu_and_not_using_local_rank(monkeypatch):
    snaps = []
    for rank in range(4):
        as_rank(monkeypatch, rank)
        snaps.append(placement.snapshot(device="cuda:0"))  # a name only: no tensor goes there
    diagnosis = placement.diagnose(snaps)
    assert diagnosis.shared == {"machine 0 cuda:0": [0, 1, 2, 3]}
    assert diagnosis.not_local == [(1, "cuda:0", 1), (2, "cuda:0", 2), (3, "cuda:0", 3)]
    assert diagnosis.problems[0] == ("ranks 0, 1, 2, 3 all use cuda:0 on machine 0: each rank "
                                     "needs its own GPU")
    assert "rank 3 uses cuda:0 (LOCAL_RANK 3)" in diagnosis.problems[1]


def test_global_rank_as_gpu_number_on_two_machines(monkeypatch):
    snaps = []
    for rank in range(4):
        as_rank(monkeypatch, rank, local_rank=rank % 2, node=rank // 2)
        snaps.append(placement.snapshot(device=f"cuda:{rank}"))
    diagnosis = placement.diagnose(snaps)
    assert diagnosis.shared == {}
    assert diagnosis.not_local == [(2, "cuda:2", 0), (3, "cuda:3", 1)]


def test_cuda_local_rank_per_machine_is_healthy(monkeypatch):
    snaps = []
    for rank in range(4):
        as_rank(monkeypatch, rank, local_rank=rank % 2, node=rank // 2)
        snaps.append(placement.snapshot(device=f"cuda:{rank % 2}"))
    assert placement.diagnose(snaps).ok  # cuda:0 on two machines is two GPUs


def test_cpu_and_meta_may_be_shared(monkeypatch):
    snaps = []
    for rank in range(3):
        as_rank(monkeypatch, rank)
        snaps.append(placement.snapshot(device="cpu" if rank else "meta"))
    assert placement.diagnose(snaps).ok


def test_device_map_draws_a_bar_per_gpu(monkeypatch):
    snaps = []
    for rank in range(4):
        as_rank(monkeypatch, rank)
        snaps.append(placement.snapshot(device="cuda:0"))
    fig = placement_views.device_map(placement.diagnose(snaps), gpus=4)
    assert isinstance(fig, Figure)
    bars = fig.axes[0].patches
    assert [b.get_height() for b in bars] == [4, 0, 0, 0]
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["ranks 0, 1, 2, 3", "idle", "idle", "idle"]


def test_device_map_needs_a_gpu(monkeypatch):
    as_rank(monkeypatch, 0)
    with pytest.raises(ValueError, match="no rank uses a GPU"):
        placement_views.device_map(placement.diagnose([placement.snapshot(device="cpu")]))


def test_machines_map_draws_every_machine_and_crosses_gpus_it_lacks(monkeypatch):
    snaps = []
    for rank in range(4):  # cuda:RANK on 2 machines x 2 GPUs
        as_rank(monkeypatch, rank, local_rank=rank % 2, node=rank // 2)
        snaps.append(placement.snapshot(device=f"cuda:{rank}"))
    fig = placement_views.machines_map(placement.diagnose(snaps), gpus=2)
    assert [ax.get_title() for ax in fig.axes] == ["machine 0 (2 GPUs)", "machine 1 (2 GPUs)"]
    assert [b.get_height() for b in fig.axes[1].patches] == [0, 0, 1, 1]
    labels = [t.get_text() for t in fig.axes[1].texts]
    assert labels == ["idle", "idle", "no such GPU:\nrank 2", "no such GPU:\nrank 3"]


def test_device_explorer_runs_each_setting_once(monkeypatch):
    calls = []

    def run(rule, machines, gpus):
        calls.append((rule, machines, gpus))
        as_rank(monkeypatch, 0)
        return placement.diagnose([placement.snapshot(device=rule)])

    box = placement_views.device_explorer(run, rules=["cuda:0", "cuda:1"])
    rule = box.children[0].children[0]
    rule.value = "cuda:0"
    rule.value = "cuda:1"
    assert calls == [("cuda:1", 2, 2), ("cuda:0", 2, 2)]


def snapshot_of_ddp_model():
    ddp_model = DDP(nn.Linear(3, 2))
    return placement.snapshot(ddp_model, device="cpu", targets=torch.zeros(2, dtype=torch.long))


def test_snapshots_come_back_from_real_ranks_through_the_ddp_wrapper():
    results = launch(snapshot_of_ddp_model, world_size=2, backend="gloo", echo=False).results
    assert [s["rank"] for s in results] == [0, 1]
    assert [s["local_rank"] for s in results] == [0, 1]
    assert results[0]["items"][0] == {"name": "model parameters", "devices": {"cpu": 2},
                                      "count": 2}
    assert placement.diagnose(results).ok
