"""Telemetry recorders against ground truth computed independently, through real launches."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course_lib import launch, telemetry
from course_lib.launching import net

# -- gradients before and after DDP's all-reduce ------------------------------------------


def _small_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 40), nn.Tanh(), nn.Linear(40, 3))


def _rank_batch(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _ddp_gradients():
    model = DDP(_small_model(), bucket_cap_mb=0.0003)  # rebuilt: one bucket per layer
    rec = telemetry.Recorder()
    rec.watch_ddp(model)
    x, y = _rank_batch(dist.get_rank())
    for step in range(3):  # the last step runs on rebuilt buckets, in backward order
        with rec.step(step):
            model.zero_grad()
            F.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.module.parameters()]


def _independent_gradients(rank):
    model = _small_model()
    x, y = _rank_batch(rank)
    F.mse_loss(model(x), y).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def ddp_grad_run():
    return launch(_ddp_gradients, 2, backend="gloo", echo=False)


def test_gradients_after_all_reduce_equal_the_mean_of_each_ranks_own(ddp_grad_run):
    own = [_independent_gradients(r) for r in (0, 1)]
    mean = {name: (own[0][name] + own[1][name]) / 2 for name in own[0]}
    grads = ddp_grad_run.telemetry.grads
    assert len(grads) == 2 * 3 * 2 * len(mean)  # ranks x steps x (before, after) x params
    for rank, _, when, _, param, _, norm, values in grads.rows():
        expected = own[rank][param] if when == "before" else mean[param]
        assert norm == pytest.approx(expected.norm().item(), rel=1e-5)
        np.testing.assert_allclose(values, expected.flatten()[:4].numpy(), rtol=1e-5, atol=1e-7)
    for final in ddp_grad_run.results:  # and DDP really left the mean in .grad
        for got, name in zip(final, mean):
            torch.testing.assert_close(got, mean[name])


def test_gradient_records_name_parameters_in_model_order(ddp_grad_run):
    grads = ddp_grad_run.telemetry.grads.where(rank=0, when="after", step=2)
    order = dict(zip(grads["param"], grads["index"]))
    assert order == {"0.weight": 0, "0.bias": 1, "2.weight": 2, "2.bias": 3}
    assert len(set(grads["bucket"])) > 1  # several buckets, so the mapping was exercised


def _hand_written_all_reduce():
    model = _small_model()
    rec = telemetry.Recorder()
    x, y = _rank_batch(dist.get_rank())
    F.mse_loss(model(x), y).backward()
    rec.gradients(model, "before")
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    rec.gradients(model, "after")


def test_explicit_gradient_records_around_a_hand_written_all_reduce():
    grads = launch(_hand_written_all_reduce, 2, backend="gloo", echo=False).telemetry.grads
    before = [np.concatenate(grads.where(rank=r, when="before")["values"]) for r in (0, 1)]
    after = [np.concatenate(grads.where(rank=r, when="after")["values"]) for r in (0, 1)]
    np.testing.assert_allclose(after[0], (before[0] + before[1]) / 2, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(after[0], after[1])
    assert not np.allclose(before[0], before[1])
    assert set(grads["bucket"]) == {-1}


# -- all-reduce calls and buckets ----------------------------------------------------------


def _bucketed_steps():
    model = DDP(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=0.02)
    rec = telemetry.Recorder()
    rec.watch_ddp(model, grads=False)
    x = torch.randn(8, 64)
    for step in range(3):
        with rec.step(step):
            loss = model(x).sum()
            with rec.span("backward"):
                loss.backward()
    info = model._get_ddp_logging_data()
    return info["bucket_sizes"], info["rebuilt_bucket_sizes"]


@pytest.fixture(scope="module")
def bucket_run():
    return launch(_bucketed_steps, 2, backend="gloo", echo=False)


def test_one_all_reduce_per_bucket_with_the_buckets_bytes(bucket_run):
    run = bucket_run
    tel = run.telemetry
    first, rebuilt = ([int(b) for b in s.split(",")] for s in run.results[0])
    assert len(first) == 1 and len(rebuilt) == 2  # docs/facts.md, a torch canary
    for rank in (0, 1):
        for step, sizes in ((0, first), (1, rebuilt), (2, rebuilt)):
            comms = tel.comms.where(rank=rank, step=step)
            assert sorted(zip(comms["bucket"], comms["bytes"])) == list(enumerate(sizes))
            assert set(comms["op"]) == {"allreduce"}
    assert len(tel.grads) == 0  # grads=False records calls only


def test_all_reduces_start_during_backward_and_take_time(bucket_run):
    tel = bucket_run.telemetry
    for rank, step, _, _, _, start, end in tel.comms.rows():
        backward = tel.spans.where(rank=rank, step=step, name="backward")
        assert backward["start"][0] <= start <= backward["end"][0]  # DDP overlaps them
        assert end > start


# -- BatchNorm -------------------------------------------------------------------------------


def _bn_input(rank, step):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(6, 3, generator=g) * (rank + 1) + step


def _batchnorm_steps():
    model = DDP(nn.Sequential(nn.BatchNorm1d(3, momentum=0.5), nn.Linear(3, 1)))
    rec = telemetry.Recorder()
    rec.watch_batchnorm(model)
    for step in range(3):
        with rec.step(step):
            model(_bn_input(dist.get_rank(), step)).sum().backward()
    with rec.step(3), torch.no_grad():  # no autograd record: statistics computed by the hook
        model(_bn_input(dist.get_rank(), 3))
    model.eval()
    with rec.step(4):  # eval mode: BatchNorm uses its buffers, nothing to record
        model(_bn_input(dist.get_rank(), 4))


def test_batchnorm_batch_statistics_and_buffers_match_direct_computation():
    bn = launch(_batchnorm_steps, 2, backend="gloo", echo=False).telemetry.batchnorm
    assert sorted(set(bn["step"])) == [0, 1, 2, 3]
    running_mean, running_var = torch.zeros(3), torch.ones(3)  # rank 0's, broadcast by DDP
    for step in range(4):
        for rank in (0, 1):
            row = bn.where(rank=rank, step=step)
            x = _bn_input(rank, step)
            np.testing.assert_allclose(row["batch_mean"][0], x.mean(0).numpy(), rtol=1e-5)
            np.testing.assert_allclose(row["batch_var"][0], x.var(0, unbiased=False).numpy(),
                                       rtol=1e-5)
            np.testing.assert_allclose(row["running_mean"][0], running_mean.numpy(), rtol=1e-5)
            np.testing.assert_allclose(row["running_var"][0], running_var.numpy(), rtol=1e-5)
        x0 = _bn_input(0, step)
        running_mean = 0.5 * running_mean + 0.5 * x0.mean(0)
        running_var = 0.5 * running_var + 0.5 * x0.var(0, unbiased=True)
    assert set(bn["layer"]) == {"0"}


# -- sampler indices ----------------------------------------------------------------------------


def _read_two_epochs():
    data = TensorDataset(torch.arange(21))
    rec = telemetry.Recorder()
    sampler = rec.watch_sampler(DistributedSampler(data, seed=3))
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    seen = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen


def test_recorded_indices_are_the_distributed_samplers():
    run = launch(_read_two_epochs, 2, backend="gloo", echo=False)
    samples = run.telemetry.samples
    data = TensorDataset(torch.arange(21))
    for rank in (0, 1):
        for epoch in (0, 1):
            expected = DistributedSampler(data, num_replicas=2, rank=rank, seed=3)
            expected.set_epoch(epoch)
            rows = samples.where(rank=rank, epoch=epoch)
            assert rows["index"].tolist() == list(expected) == run.results[rank][epoch]
            assert rows["position"].tolist() == list(range(11))  # ceil(21 / 2), padded


# -- spans, scalars and the shared clock -------------------------------------------------------


def _spans_and_scalars():
    rec = telemetry.Recorder()
    dist.barrier()
    wall = time.time()
    with rec.span("after barrier"):
        pass
    with rec.step(7):
        with rec.span("inner"):
            time.sleep(0.01)
        rec.scalar("tensor", torch.tensor(2.5) * (dist.get_rank() + 1))
        rec.scalar("float", 1.5, step=3)
    return wall


def test_spans_and_scalars_on_a_clock_every_rank_shares():
    run = launch(_spans_and_scalars, 2, backend="gloo", echo=False)
    spans, scalars = run.telemetry.spans, run.telemetry.scalars
    starts = spans.where(name="after barrier")["start"]
    assert abs(starts[0] - starts[1]) < 0.1  # both left the barrier together
    for rank, wall in enumerate(run.results):
        assert abs(spans.where(rank=rank, name="after barrier")["start"][0] - wall) < 0.005
        step_span = spans.where(rank=rank, name="step")
        inner = spans.where(rank=rank, name="inner")
        assert inner["step"][0] == step_span["step"][0] == 7
        assert step_span["start"][0] <= inner["start"][0] < inner["end"][0] <= step_span["end"][0]
        assert inner["end"][0] - inner["start"][0] >= 0.01
        assert scalars.where(rank=rank, name="tensor")["value"].tolist() == [2.5 * (rank + 1)]
        assert scalars.where(rank=rank, name="float")["step"].tolist() == [3]


# -- recording off changes nothing and costs nothing ------------------------------------------


def _train(record):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)))
    rec = telemetry.Recorder(enabled=record)
    rec.watch_ddp(model)
    rec.watch_batchnorm(model)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 6, generator=g), torch.randn(32, 1, generator=g))
    loader = DataLoader(data, batch_size=4, sampler=rec.watch_sampler(DistributedSampler(data)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step, (x, y) in enumerate(loader):
        with rec.step(step):
            with rec.span("forward"):
                loss = F.mse_loss(model(x), y)
            with rec.span("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            rec.scalar("loss", loss)
        losses.append(loss.item())
    installed = (model._get_ddp_logging_data().get("comm_hook"),
                 sum(len(m._forward_pre_hooks) for m in model.module.modules()))
    return losses, {k: v.clone() for k, v in model.module.state_dict().items()}, installed


@pytest.fixture(scope="module")
def recorded_run():
    return launch(_train, 2, args=(True,), backend="gloo", echo=False)


def test_recording_leaves_losses_and_weights_bitwise_equal(recorded_run):
    plain = launch(_train, 2, args=(False,), backend="gloo", echo=False)
    for (losses_on, weights_on, _), (losses_off, weights_off, _) in zip(recorded_run.results,
                                                                        plain.results):
        assert losses_on == losses_off
        assert all(torch.equal(weights_on[k], weights_off[k]) for k in weights_off)
    assert recorded_run.results[0][2][0] and recorded_run.results[0][2][1] == 1  # hooks were on
    assert [r[2] for r in plain.results] == [(None, 0), (None, 0)]  # off: nothing installed
    assert all("telemetry" not in extras for extras in plain.extras)  # and nothing sent back
    assert plain.telemetry.ranks == [] and len(plain.telemetry.spans) == 0


def test_recorded_run_has_every_table_for_every_rank(recorded_run):
    tel = recorded_run.telemetry
    assert tel.ranks == [0, 1] and tel.world_size == 2
    for name in ("scalars", "spans", "grads", "comms", "batchnorm", "samples"):
        assert set(getattr(tel, name)["rank"]) == {0, 1}, name
    losses = [r[0] for r in recorded_run.results]
    for rank in (0, 1):
        assert tel.scalars.where(rank=rank, name="loss")["value"].tolist() == losses[rank]


# -- Chrome traces ----------------------------------------------------------------------------


def test_chrome_trace_is_valid_json_with_one_track_per_rank(recorded_run, tmp_path):
    tel = recorded_run.telemetry
    trace = json.loads(tel.to_chrome_trace(tmp_path / "run.json").read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert len([e for e in slices if e["tid"] == 1]) == len(tel.comms)
    assert len([e for e in slices if e["tid"] == 0]) == len(tel.spans)


def _profiled_steps(directory):
    from torch.profiler import ProfilerActivity, profile, record_function

    model = DDP(nn.Linear(32, 32))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            with record_function("forward"):
                loss = model(torch.randn(4, 32)).sum()
            with record_function("backward"):
                loss.backward()
        # torch 2.11 can export the last all-reduce, still ending on gloo's thread, as
        # 'finished': False without its shapes; a barrier lets it end inside the profile
        dist.barrier()
    prof.export_chrome_trace(f"{directory}/trace{dist.get_rank()}.json")


def test_profiler_traces_load_into_spans_and_comms(tmp_path):
    launch(_profiled_steps, 2, args=(str(tmp_path),), backend="gloo", echo=False)
    tel = telemetry.load_profiler_traces([tmp_path / "trace1.json", tmp_path / "trace0.json"])
    assert tel.ranks == [0, 1]  # from each trace's distributedInfo, not the order given
    for rank in (0, 1):
        assert len(tel.spans.where(rank=rank, name="backward")) == 2
        reduces = tel.comms.where(rank=rank, op="allreduce")
        assert reduces["bytes"].tolist() == [(32 * 32 + 32) * 4] * 2
    starts = [tel.spans.where(rank=r, name="forward")["start"][0] for r in (0, 1)]
    assert abs(starts[0] - starts[1]) < 1.0  # one clock for both traces


# -- without the launcher: files per rank ---------------------------------------------------

TORCHRUN_SCRIPT = """
import gc
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from course_lib import telemetry

dist.init_process_group("gloo")
model = DDP(nn.Linear(4, 2))
rec = telemetry.Recorder()
rec.watch_ddp(model)
for step in range(2):
    with rec.step(step):
        model(torch.randn(3, 4)).sum().backward()
        rec.scalar("rank", dist.get_rank())
del model
gc.collect()  # DDP sits in a reference cycle: free it before its process group goes
dist.destroy_process_group()
"""


@pytest.mark.kernel  # torchrun starts cold Python processes
def test_under_torchrun_each_rank_writes_a_file_that_loads(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, **net.loopback_env(), "OMP_NUM_THREADS": "1",
           telemetry.ENV_DIR: str(tmp_path / "telemetry")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script)], env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    tel = telemetry.load(tmp_path / "telemetry")
    assert tel.ranks == [0, 1] and tel.world_size == 2
    for rank in (0, 1):
        assert tel.scalars.where(rank=rank)["value"].tolist() == [rank, rank]
        assert len(tel.comms.where(rank=rank)) == 2 and len(tel.grads.where(rank=rank)) == 8


def test_save_and_load_without_any_process_group(tmp_path):
    rec = telemetry.Recorder()
    with rec.step(0):
        rec.scalar("x", 1.0)
    rec.samples([3, 1], epoch=0)
    rec.save(tmp_path)
    tel = telemetry.load(tmp_path)
    assert tel.ranks == [0]
    assert tel.scalars["value"].tolist() == [1.0]
    assert tel.samples["index"].tolist() == [3, 1]
    assert len(tel.spans.where(name="step")) == 1


# -- tables ------------------------------------------------------------------------------------


def test_table_filters_and_concatenates():
    a = telemetry.Table({"rank": [0, 0, 1], "name": ["x", "y", "x"], "v": [[1, 2], [3], [4]]})
    assert len(a.where(name="x")) == 2 and a.where(rank=1)["v"][0].tolist() == [4.0]
    b = telemetry.Table.concat([a, telemetry.Table({"rank": [], "name": [], "v": []}), a])
    assert len(b) == 6 and b.unique("name") == ["x", "y"]
    assert next(b.rows())[:2] == (0, "x")


def test_to_pandas_explains_that_pandas_is_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    with pytest.raises(ImportError, match="pip install pandas"):
        telemetry.Table({"rank": [0]}).to_pandas()


def test_to_pandas_gives_a_data_frame_when_pandas_is_installed():
    pd = pytest.importorskip("pandas")
    frame = telemetry.Table({"rank": [0, 1], "v": [[1.0], [2.0]]}).to_pandas()
    assert isinstance(frame, pd.DataFrame) and frame["rank"].tolist() == [0, 1]


def test_recorder_rejects_what_it_cannot_record():
    rec = telemetry.Recorder()
    with pytest.raises(ValueError, match="one number"):
        rec.scalar("x", torch.ones(2))
    with pytest.raises(ValueError, match="before"):
        rec.gradients(nn.Linear(2, 2), "during")
    with pytest.raises(ValueError, match="no BatchNorm"):
        rec.watch_batchnorm(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        rec.watch_ddp(nn.Linear(2, 2))


# -- the plug-in protocols (telemetry/host.py, chrome.TraceTables) -------------------------


class _ListHost:
    """A host that is not a Recorder: the watchers need only what RecordHost names."""

    def __init__(self):
        self.current_step, self.rows = 7, []

    def record_row(self, table, *values):
        self.rows.append((table, *values))

    def record_grads(self, step, when, bucket, flat, layout):
        raise AssertionError("not used here")

    def layout(self, params, names):
        raise AssertionError("not used here")


def test_the_recorder_and_telemetry_satisfy_the_protocols():
    from course_lib.telemetry.chrome import TraceTables
    from course_lib.telemetry.host import Exporter, RecordHost

    rec = telemetry.Recorder(enabled=False)
    assert isinstance(rec, RecordHost) and isinstance(rec, Exporter)
    assert isinstance(rec.telemetry(), TraceTables)
    assert not isinstance(object(), RecordHost)  # the check can fail


def test_watchers_write_into_any_host():
    from course_lib.telemetry import batchnorm
    from course_lib.telemetry.sampler import RecordedSampler

    host = _ListHost()
    assert list(RecordedSampler([4, 2], host)) == [4, 2]
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    batchnorm.watch(host, model)
    model(torch.randn(5, 3))
    assert [r[:2] for r in host.rows] == [("samples", 0), ("samples", 0), ("batchnorm", 7)]
