"""The x-ray's probes: their events match their schemas, a probe's own failure (at install
or while it runs) never breaks the learner's run and leaves its rules "not judged" with the
reason, and every private torch name they patch exists on this torch."""

from __future__ import annotations

import ast
import functools
import inspect
from types import ModuleType

import pytest

from course_lib.xray.detectors import in_report_order, run_all
from course_lib.xray.events import EVENTS, KIND_OF
from course_lib.xray.probes import PROBES, name
from course_lib.xray.record import COLLECTOR
from course_lib.xray.run_events import RunEvents


def _noted_kinds(module: ModuleType) -> set[str]:
    """The event kinds a module writes: the first argument of its record.note calls."""
    return {node.args[0].value for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "note"
            and node.args and isinstance(node.args[0], ast.Constant)}


def _writers(probe: str) -> list[str]:
    """The ids of the rules that read an event kind this probe writes."""
    return [r.id for r in in_report_order()
            if any(EVENTS[KIND_OF[s]].writer == probe for s in r.needs)]


FEEDING = [name(p) for p in PROBES if _writers(name(p))]  # the probes some rule reads


def test_every_event_kind_has_a_schema_and_its_writer() -> None:
    """events.EVENTS names, for each kind, the probe whose record.note writes it, and every
    kind a rule needs is written by a probe (not only declared)."""
    written = {k: name(p) for p in PROBES for k in _noted_kinds(p)}
    written["probe_error"] = "record"  # record.guard's own
    assert written == {k: kind.writer for k, kind in EVENTS.items()}
    needed = {KIND_OF[s] for r in in_report_order() for s in r.needs}
    assert needed <= set(written) and "probe_error" not in needed
    assert set(FEEDING) == {"data", "output", "collectives", "ddp", "optim", "checkpoint",
                            "amp", "tensor_parallel", "pipeline"}


def test_every_private_torch_name_the_probes_patch_exists_on_this_torch() -> None:
    """An inventory (scripts/test-torch-oldest runs it on the oldest torch too): each
    probe's patches resolve, and the private names among them are the ones listed here,
    so a new one is seen; the collectives the probe wraps all exist in c10d."""
    import torch.distributed.distributed_c10d as c10d

    from course_lib.xray.probes.collectives import OPS

    private = set()
    for probe in PROBES:
        for patch in probe.patches():
            assert hasattr(patch.owner, patch.name), (name(probe), patch.name)
            owner = getattr(patch.owner, "__qualname__", getattr(patch.owner, "__name__", ""))
            for part in (*owner.split("."), patch.name):
                if part.startswith("_") and not part.startswith("__"):
                    private.add(f"{owner}.{patch.name}")
    styles = {f"{style}._apply" for style in (
        "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
        "PrepareModuleOutput", "PrepareModuleInputOutput")}
    assert private == {"_BaseDataLoaderIter._next_index", "_BaseDataLoaderIter.__next__",
                       "DistributedDataParallel._sync_buffers", "_BatchNorm.forward",
                       "_PipelineSchedule.__init__", *styles}
    assert [op for op in OPS if not hasattr(c10d, op)] == []


def _rename_then_observe(owner: type, attribute: str, fn) -> object:
    """In the rank: take a method a probe patches off its class, as a torch release that
    renamed it would (torch's own calls still find it, through __getattr__), then run fn as
    the x-ray does."""
    import types

    from course_lib.xray.on_rank import observed

    method = owner.__dict__[attribute]
    delattr(owner, attribute)

    def __getattr__(self, wanted: str) -> object:
        if wanted == attribute:
            return types.MethodType(method, self)
        raise AttributeError(wanted)

    owner.__getattr__ = __getattr__
    return observed(fn)


def _train_a_little() -> bool:
    """A DDP run over a DataLoader; True when DataLoader's constructor is the real one."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 4))
    for (x,) in DataLoader(data, batch_size=8, sampler=DistributedSampler(data)):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    print(f"trained {len(data)} samples")
    return not hasattr(DataLoader.__init__, "__wrapped__")  # functools.wraps sets it


def test_a_torch_name_missing_under_a_probe_leaves_its_rules_not_judged_not_a_crash() -> None:
    """M2: with DataLoader's iterator class missing _next_index, the data probe patches
    nothing (all or nothing: DataLoader.__init__ stays torch's), the run trains, the other
    probes still watch it, and the data rules say why they were not judged."""
    from torch.utils.data import dataloader as dl

    from course_lib.launching import launch

    run = launch(functools.partial(_rename_then_observe, dl._BaseDataLoaderIter,
                                   "_next_index", _train_a_little), 2, timeout=60, echo=False)
    assert run.results == [True, True]  # DataLoader.__init__ left unpatched: none of data's
    events = RunEvents.from_run(2, run)
    report = run_all(events)
    reason = ("the x-ray's data probe could not be installed on this torch (AttributeError: "
              "type object '_BaseDataLoaderIter' has no attribute '_next_index')")
    assert {u.id for u in report.not_checked if u.reason == reason} == set(_writers("data"))
    assert "P16" in report.ids  # the output probe still watched: both ranks printed


def _break(probe: str) -> None:
    """In this rank, make record.note raise whenever the named probe module calls it (a bug
    in that probe's bookkeeping)."""
    import sys

    from course_lib.xray import record

    real = record.note

    def note(kind, where_=None, **fields):
        if sys._getframe(1).f_globals["__name__"] == f"course_lib.xray.probes.{probe}":
            raise RuntimeError(f"broken {probe} probe")
        return real(kind, where_, **fields)

    record.note = note


def _train_with_a_broken_probe(probe: str) -> None:
    """A small DDP run that exercises every probe but the parallel ones, with the named
    probe broken (_break)."""
    import tempfile

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    _break(probe)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DistributedSampler(data)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(data, batch_size=16, sampler=sampler):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            opt.step()
    dist.all_reduce(loss.detach())
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.3f}, {torch.cuda.device_count()} GPUs")
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.module.state_dict(), f"{folder}/m.pt")
        model.module.load_state_dict(torch.load(f"{folder}/m.pt"))


def _train_in_parallel(probe: str) -> None:
    """On 2 ranks, tensor parallelism over a DataLoader, then one step of a 2-stage
    pipeline: what the tensor_parallel and pipeline probes watch, with the named probe
    broken (_break)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    _break(probe)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1), nn.Dropout(0.1))
    model = parallelize_module(mlp, init_device_mesh("cpu", (2,)),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    for x, y in DataLoader(data, batch_size=8, sampler=DistributedSampler(data, 1, 0)):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    rank = dist.get_rank()
    stage = PipelineStage(nn.Linear(4, 4) if rank == 0 else nn.Linear(4, 1), rank, 2,
                          torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    if rank == 0:
        schedule.step(torch.randn(8, 4))
    else:
        schedule.step(target=torch.randn(8, 1), losses=[])


PARALLEL = ("tensor_parallel", "pipeline")  # the probes that _train_in_parallel exercises


@pytest.mark.parametrize("probe", FEEDING)
def test_a_broken_probe_says_not_judged_and_never_breaks_the_run(probe) -> None:
    """Every probe's bookkeeping runs under record.guard: the run returns, and each id the
    probe feeds is listed as not judged, never judged on missing events."""
    from course_lib.xray import xray

    train = _train_in_parallel if probe in PARALLEL else _train_with_a_broken_probe
    report = xray(functools.partial(train, probe), world_size=2, timeout=60)
    assert report.failure is None, str(report)
    for pid in _writers(probe):
        assert any(u.id == pid and u.reason.startswith(f"the x-ray's {probe} probe failed on "
                                                       "rank") for u in report.not_checked), \
            str(report)
        assert pid not in report.ids and pid not in {c.id for c in report.checked}


def test_a_failing_probe_that_feeds_no_rule_is_reported_as_incomplete() -> None:
    from course_lib.xray import record

    record.clear()
    with record.guard(probe="gpu"):
        raise KeyError("device_count")
    with record.guard():
        raise KeyError("fingerprints")  # raised here, not inside a probe module
    events = list(record.events())
    record.clear()
    assert [(e["kind"], e["probe"]) for e in events] == [("probe_error", "gpu"),
                                                         ("probe_error", "")]
    report = run_all(RunEvents(world_size=2, by_rank={0: events, 1: []}))
    assert [line.split(" (")[0] for line in report.incomplete] == [
        "the x-ray's gpu probe failed on rank 0", "the x-ray's own probe failed on rank 0"]


def test_a_run_s_events_match_their_schemas() -> None:
    """Every event a real DDP run's probes wrote has its kind's fields (xray/events.py)."""
    from course_lib.xray import xray
    from course_lib.xray.events import mismatch

    report = xray(functools.partial(_train_with_a_broken_probe, "no probe"), world_size=2,
                  timeout=60)
    assert report.run is not None
    events = [e for extras in report.run.extras for e in extras[COLLECTOR]]
    assert [mismatch(e) for e in events if mismatch(e)] == []
    assert {"loader", "pass", "sampler", "set_epoch", "print", "collective", "ddp_buffer_sync",
            "ddp", "batchnorm", "opt_step", "autocast", "save", "load", "load_state_dict",
            "gpu_query"} <= {e["kind"] for e in events}


def test_a_parallel_run_s_events_match_their_schemas() -> None:
    from course_lib.xray import xray
    from course_lib.xray.events import mismatch

    report = xray(functools.partial(_train_in_parallel, "no probe"), world_size=2, timeout=60)
    assert report.run is not None and report.failure is None, str(report)
    events = [e for extras in report.run.extras for e in extras[COLLECTOR]]
    assert [mismatch(e) for e in events if mismatch(e)] == []
    assert {"tp_plan", "tp_input", "seed", "tp_dropout", "pipeline_schedule",
            "pipeline_step"} <= {e["kind"] for e in events}
    assert {c.id for c in report.checked} >= {"TP4", "TP5", "TP9", "PP1", "PP5", "PP4"}


def _uninstallable(probe: str, fn) -> object:
    """In the rank: the probe's patches() raises as it would on a torch without the names
    it wraps, then fn runs as the x-ray runs it."""
    from course_lib.xray import probes
    from course_lib.xray.on_rank import observed

    def missing() -> list:
        raise ImportError(f"cannot import name 'api' (a torch without {probe})")
    getattr(probes, probe).patches = missing
    return observed(fn)


@pytest.mark.parametrize("probe", PARALLEL)
def test_a_parallel_probe_that_cannot_be_installed_leaves_its_rules_not_judged(probe) -> None:
    """M2 for the parallel probes: the run trains, and each rule reading the probe's events
    (P03 too, which needs the tensor-parallel groups) says why it was not judged."""
    from course_lib.launching import launch

    run = launch(functools.partial(_uninstallable, probe, functools.partial(
        _train_in_parallel, "no probe")), 2, timeout=60, echo=False)
    report = run_all(RunEvents.from_run(2, run))
    reason = (f"the x-ray's {probe} probe could not be installed on this torch (ImportError: "
              f"cannot import name 'api' (a torch without {probe}))")
    fed = {"tensor_parallel": {"P03", "TP4", "TP8", "TP5", "TP9"},
           "pipeline": {"PP1", "PP5", "PP4"}}[probe]
    assert set(_writers(probe)) == fed
    assert {u.id for u in report.not_checked if u.reason == reason} == fed


def test_recorded_wraps_the_collectives_only_inside_its_block() -> None:
    """The checks' recorder is the x-ray probe's: each call once, with its tensor argument's
    storage, and torch.distributed as it was after the block."""
    import torch
    import torch.distributed as dist

    from course_lib.xray.probes.collectives import OPS, Call, recorded, storage_of

    real, t = dist.all_reduce, torch.zeros(3)
    with recorded() as calls:
        assert dist.all_reduce is not real
        with pytest.raises((RuntimeError, ValueError)):  # no process group here
            dist.all_reduce(t[1:])
        with pytest.raises((RuntimeError, ValueError)):
            dist.barrier()
    assert dist.all_reduce is real
    assert calls == [Call("all_reduce", storage_of(t)), Call("barrier", 0)]
    assert {"all_reduce", "all_gather_object"} <= {n for n, op in OPS.items() if op.combines}
