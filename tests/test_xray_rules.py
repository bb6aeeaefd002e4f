"""The x-ray's rules on hand-made events (no launch): each rule fires on the run that shows
its pitfall and stays quiet on the run beside it; the rule table refuses what it cannot
judge; the report lists every rule once and says why it did not judge one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from course_lib.xray.detectors import amp, checkpoint, data, in_report_order, model, run_all
from course_lib.xray.events import Pass, Print, mismatch
from course_lib.xray.report import Checked, Finding, Report, Unjudged, finding
from course_lib.xray.rules import RULES, Rule, rule
from course_lib.xray.run_events import RunEvents, Undeclared


def _run(*per_rank: list[dict]) -> RunEvents:
    """RunEvents of len(per_rank) ranks with these events."""
    return RunEvents(world_size=len(per_rank), by_rank=dict(enumerate(per_rank)))


def _ev(kind: str, t: float = 0.0, **fields) -> dict:
    """An event as a probe writes it (it must match its schema in xray/events.py)."""
    event = {"kind": kind, "where": "train.py:7", "t": t, **fields}
    assert not mismatch(event), mismatch(event)
    return event


def _found(area, run: RunEvents) -> list[Finding]:
    """The findings of the rules declared in one detector module, each judged on its view."""
    verdicts = [r.verdict(run) for r in in_report_order() if r.judge.__module__ == area.__name__]
    return [v for v in verdicts if isinstance(v, Finding)]


def _ids(area, run: RunEvents) -> list[tuple[str, str]]:
    return [(f.id, f.certainty) for f in _found(area, run)]


_COUNTS = {"synced": 1, "local": 0, "all_used": 1, "no_sync": 0}


def _step(step: int, grads: list, params: list, **counts) -> dict:
    counts = {**_COUNTS, **counts}
    counts.setdefault("accumulated", counts["synced"])
    return _ev("opt_step", step=step, opt="SGD#1", grads=grads, params=params, shapes="s",
               **counts)


# -- the model rules ---------------------------------------------------------------------------

def test_p08_needs_averaged_gradients_and_differing_replicas() -> None:
    same, other = [[1.0, 2.0], [3.0, 4.0]], [[1.5, 2.5], [3.5, 4.5]]
    assert _ids(model, _run([_step(1, same, same)], [_step(1, same, other)])) == [
        ("P08", "confirmed")]
    assert _ids(model, _run([_step(1, same, same)], [_step(1, other, other)])) == []
    assert _ids(model, _run([_step(1, same, other)], [_step(1, same, other)])) == []
    # the first parameter's gradient averaged, the second's not: the second drifts apart
    partial = _run([_step(3, same, same)], [_step(3, [same[0], other[1]], [same[0], other[1]])])
    findings = _found(model, partial)
    assert [f.id for f in findings] == ["P08"]
    assert "1 of 2 parameters differ" in findings[0].evidence


def test_p09_counts_synced_backwards_per_step() -> None:
    def steps(synced: int, local: int) -> list[dict]:
        return [_step(i, [[1.0, 1.0]], [[1.0, 1.0]], synced=synced, local=local)
                for i in range(1, 5)]
    ddp = _ev("ddp", find_unused=False, static_graph=False, params=1, batchnorm=[],
              sync_batchnorm=[])
    findings = _found(model, _run([ddp, *steps(4, 0)], [ddp, *steps(4, 0)]))
    assert [f.id for f in findings] == ["P09"]
    assert "16 backward passes" in findings[0].evidence
    assert "4 optimizer steps" in findings[0].evidence
    assert _ids(model, _run([ddp, *steps(1, 3)], [ddp, *steps(1, 3)])) == []
    # a GAN's discriminator: its gradients were all-reduced in the generator's step too,
    # but zero_grad() dropped them: one backward per step counts
    gan = [_step(i, [[1.0, 1.0]], [[1.0, 1.0]], synced=2, accumulated=1) for i in (1, 2)]
    assert _ids(model, _run([ddp, *gan], [ddp, *gan])) == []


def test_p10_find_unused_without_unused_parameters_is_a_suspicion() -> None:
    ddp = _ev("ddp", find_unused=True, static_graph=False, params=4, batchnorm=[],
              sync_batchnorm=[])
    steps = [_step(i, [[1.0, 1.0]], [[1.0, 1.0]]) for i in range(1, 4)]
    assert _ids(model, _run([ddp, *steps], [ddp, *steps])) == [("P10", "suspected")]
    unused = _ev("ddp_unused", names=["aux.weight"], count=1, of=4)
    assert _ids(model, _run([ddp, *steps, unused], [ddp, *steps])) == []


def _bn(batch: int) -> dict:
    return _ev("batchnorm", layer="bn1", cls="BatchNorm2d", batch=batch, layer_id=1)


def test_p05_small_per_rank_batches_only_and_the_fix_goes_where_ddp_wraps() -> None:
    ddp = _ev("ddp", find_unused=False, static_graph=False, params=4, batchnorm=["bn1"],
              sync_batchnorm=[])
    ddp["where"] = "train.py:30"
    findings = _found(model, _run([ddp, _bn(4), _bn(8)], [ddp, _bn(8)]))
    assert [(f.id, f.where) for f in findings] == [("P05", "train.py:30")]
    assert "convert_sync_batchnorm" in findings[0].evidence
    assert _ids(model, _run([_bn(4), _bn(64)], [_bn(64)])) == []  # a short last batch


# -- the checkpoint rules ----------------------------------------------------------------------

def _save(t: float, **fields) -> dict:
    return _ev("save", t, **{"path": "/run/ckpt.pt", "prefixed": 0, "keys": 4,
                             "t_end": t + 0.01, "size": 100, "collectives": 2,
                             "ddp_forwards": 3, "ddp_backwards": 3, **fields})


def _load(t: float, **fields) -> dict:
    return _ev("load", t, **{"path": "/run/ckpt.pt", "size": 100, "t_end": t + 0.01,
                             "collectives": 2, "ddp_forwards": 3, "ddp_backwards": 3,
                             **fields})


def test_p15_a_load_no_collective_orders_after_the_save() -> None:
    lucky = _run([_save(1.0), _load(1.02)], [_load(1.015)])
    assert _ids(checkpoint, lucky) == [("P15", "confirmed")]
    barrier = _run([_save(1.0), _load(1.02, collectives=3)], [_load(1.015, collectives=3)])
    assert _ids(checkpoint, barrier) == []
    failed = _run([_save(1.0), _load(1.02)],
                  [_load(1.001, size=-1, error="FileNotFoundError: no such file")])
    assert _ids(checkpoint, failed) == [("P15", "confirmed")]


def test_p15_resuming_at_start_is_not_a_race() -> None:
    """Every rank tries the checkpoint at start (none yet), rank 0 saves at the end."""
    missing = {"size": -1, "error": "FileNotFoundError: no such file", "collectives": 0,
               "ddp_forwards": 0, "ddp_backwards": 0}
    assert _ids(checkpoint, _run([_load(0.1, **missing), _save(0.5)],
                                 [_load(0.1, **missing)])) == []


def test_p12_prefixed_keys_into_a_plain_model() -> None:
    def loaded(wrapper: bool, prefixed: int, **outcome) -> dict:
        return _ev("load_state_dict", **{"module": "Net", "wrapper": wrapper,
                                         "prefixed": prefixed, "keys": 4, "strict": True,
                                         **outcome})
    plain = _run([loaded(False, 4, error="RuntimeError: Error(s)\n\tUnexpected key(s) in "
                                         "state_dict: \"module.w\"")], [])
    findings = _found(checkpoint, plain)
    assert [f.id for f in findings] == ["P12"] and "Unexpected key(s)" in findings[0].evidence
    assert _found(checkpoint, _run([loaded(True, 4, missing=0, unexpected=0)], [])) == []
    assert _found(checkpoint, _run([loaded(False, 0, missing=0, unexpected=0)], [])) == []
    # a model with its own submodule named 'module' loads its 'module.' keys cleanly
    assert _found(checkpoint, _run([loaded(False, 4, missing=0, unexpected=0)], [])) == []
    lenient = _found(checkpoint, _run([loaded(False, 4, strict=False, missing=4,
                                                unexpected=4)], []))
    assert [f.id for f in lenient] == ["P12"] and "4 of the model's keys" in lenient[0].evidence


# -- the amp and data rules --------------------------------------------------------------------

def test_s3_fp16_without_scaler_and_zero_gradients() -> None:
    fp16 = _ev("autocast", device="cpu", dtype="float16", training=True)
    steps = [_ev("opt_step", step=i, opt="SGD#1", zero=99, values=100, max_abs=1e-7,
                 accumulated=1, **_COUNTS) for i in (1, 2)]
    assert _ids(amp, _run([fp16, *steps], [fp16, *steps])) == [("S3", "confirmed")]
    scaled = _ev("scaler_scale")
    assert _ids(amp, _run([fp16, scaled, *steps], [fp16, scaled, *steps])) == []
    healthy = [_ev("opt_step", step=1, opt="SGD#1", zero=1, values=100, max_abs=0.1,
                   accumulated=1, **_COUNTS)]
    assert _ids(amp, _run([fp16, *healthy], [fp16, *healthy])) == [("S3", "suspected")]
    bf16 = _ev("autocast", device="cpu", dtype="bfloat16", training=True)
    assert _ids(amp, _run([bf16, *steps], [bf16, *steps])) == []


def _pass(number: int, indices: list[int], where: str, **fields) -> dict:
    settings = {"num_replicas": 2, "rank": 0, "shuffle": True, "drop_last": False,
                "total_size": 8, "epoch": 0}
    event = _ev("pass", float(number), **{
        "loader": "train.py:12#1", "number": number, "sampler_key": 1,
        "sampler": "DistributedSampler", "random": True, "distributed": settings,
        "dataset_len": 8, "grad": True, "indices": [indices], "sizes": [len(indices)],
        "fingerprints": [[float(i) for i in indices]], "backward": 1, "done": True,
        "base": "TensorDataset", **fields})
    event["where"] = where
    return event


def test_p04_names_the_loop_where_set_epoch_goes_not_the_dataloader_line() -> None:
    """Issue 36 item 8: the fix (sampler.set_epoch(epoch)) goes before the loop over the
    loader, in the epoch loop; the DataLoader(...) line is named in the evidence."""
    rank0 = [_pass(n, [3, 1, 0, 2], "train.py:20") for n in range(3)]
    rank1 = [_pass(n, [7, 5, 4, 6], "train.py:20") for n in range(3)]
    findings = _found(data, _run(rank0, rank1))
    assert [(f.id, f.where) for f in findings] == [("P04", "train.py:20")]
    assert "DataLoader made at train.py:12" in findings[0].evidence
    assert "call sampler.set_epoch(epoch) before this loop" in findings[0].evidence


# -- the rule table ----------------------------------------------------------------------------

def test_a_rule_is_refused_at_import_for_what_it_cannot_judge() -> None:
    from course_lib.xray.events import ProbeError

    with pytest.raises(ValueError, match="P99"):
        rule("P99", needs=(Pass,), absent="x")
    with pytest.raises(ValueError, match="unknown event schemas"):
        rule("P01", needs=(dict,), absent="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown event schemas"):
        rule("P01", needs=(ProbeError,), absent="x")
    with pytest.raises(ValueError, match="absent"):
        rule("P01", needs=(Pass,), absent=" ")
    with pytest.raises(ValueError, match="second rule"):
        rule("P04", needs=(Pass,), absent="x")


def test_a_rule_reads_only_the_events_it_needs() -> None:
    """M5: a judge that reads a kind outside its `needs` raises, so the case tests catch a
    rule whose `needs` (what decides "not judged" when a probe fails) is incomplete."""
    def judge(run: RunEvents) -> Finding | None:
        run.of(Print)
        return None
    sneaky = Rule("P16", (Pass,), judge, "nothing")
    with pytest.raises(Undeclared, match="Print"):
        sneaky.verdict(_run([], []))
    with pytest.raises(Undeclared):
        _run([]).only((Pass,)).kinds()
    assert _run([_ev("print", text="hi")]).only((Print,)).of(Print)[0][1]["text"] == "hi"


def test_every_rule_says_what_not_found_means() -> None:
    """Issue 36 item 4: a clean run lists each rule checked with its own condition; P05's
    says the batch size it looks for, not "plain BatchNorm" (a model may have one)."""
    absent = {r.id: r.absent for r in RULES.values()}
    assert "16 or fewer samples per rank" in absent["P05"]
    assert all(len(text) > 20 for text in absent.values()), absent


# -- the report --------------------------------------------------------------------------------

def _report_of(run: RunEvents, **options: str) -> Report:
    return run_all(run, **options)


def test_every_rule_is_listed_once_found_checked_or_not_judged() -> None:
    report = _report_of(_run([], []))
    ids = [*report.ids, *(c.id for c in report.checked), *(u.id for u in report.not_checked)]
    assert sorted(ids) == sorted(RULES)
    assert Unjudged("P18", "no DataLoader was made") in report.not_checked
    failed = _report_of(_run([], []), absence_proves_nothing="the run failed before it finished")
    assert failed.checked == [] and len(failed.not_checked) == len(RULES)
    nothing = _report_of(_run([], []), judge_nothing="the script did not train here")
    assert {u.reason for u in nothing.not_checked} == {"the script did not train here"}


def test_a_finding_that_explains_another_hides_it_with_the_reason(monkeypatch) -> None:
    """P20 hides S1 (its hang is uneven batches' symptom): S1 is listed as not judged."""
    for pid in ("P20", "S1"):
        def found(run: RunEvents, pid: str = pid) -> Finding:
            return finding(pid, "e")
        found.__module__ = RULES[pid].judge.__module__  # its place in the report's order
        monkeypatch.setitem(RULES, pid, dataclasses.replace(RULES[pid], judge=found))
    report = _report_of(_run([], []))
    assert report.ids == ["P20"]
    assert Unjudged("S1", "its symptom is explained by P20's finding above") in \
        report.not_checked


def test_report_text_json_and_exit_status() -> None:
    """The JSON keeps its shape (lists of strings for checked and not_checked); the text
    groups the rules not judged for one reason on one line; 3 means could not judge."""
    report = Report(findings=[finding("P03", "e", "train.py:3", "suspected")],
                    checked=[Checked("P05", "no plain BatchNorm")],
                    not_checked=[Unjudged("P12", "no load"), Unjudged("P15", "no load")],
                    title="X")
    out = json.loads(report.to_json())
    assert out["checked"] == ["P05 no plain BatchNorm"]
    assert out["not_checked"] == ["P12: no load", "P15: no load"]
    assert set(out["findings"][0]) == {"id", "title", "evidence", "where", "lesson",
                                       "certainty"}
    assert "Not judged:\n  P12, P15: no load" in str(report)
    assert report.exit_status == 0
    report.cause = "Cannot run here: ..."
    assert str(report).splitlines()[0] == "Cannot run here: ..." and report.exit_status == 3
    report.findings = [finding("P03", "e")]
    assert report.exit_status == 1


def test_a_traceback_s_frames_are_read_from_a_script_and_from_a_notebook_cell() -> None:
    """cause() names the learner's line from a failed rank's traceback text, as Python
    writes it for a script and as the launcher names a notebook cell's frames."""
    from course_lib.xray.cause import frames

    text = ('Traceback (most recent call last):\n'
            '  File "/tmp/x/train.py", line 14, in ddp_setup\n'
            '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n'
            '  Cell In[4], line 5, in train\n'
            '    model.cuda()\n'
            '  File "/venv/site-packages/torch/cuda/__init__.py", line 689, in set_device\n'
            "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'\n")
    found = frames(text)
    assert [(f.file, f.line, f.function, f.source) for f in found] == [
        ("/tmp/x/train.py", 14, "ddp_setup",
         'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))'),
        ("Cell In[4]", 5, "train", "model.cuda()"),
        ("/venv/site-packages/torch/cuda/__init__.py", 689, "set_device", "")]
    assert found[1].where == "Cell In[4], line 5"


# -- the tensor- and pipeline-parallel rules ---------------------------------------------------

def _tp_plan(group: list[int], shape: list[int] | None = None,
             dims: list[str] | None = None) -> dict:
    return _ev("tp_plan", key="train.py:30#1", group=group, dim="tp",
               mesh_shape=shape or [len(group)], mesh_dims=dims or ["tp"],
               plan=["feed_forward.w1", "feed_forward.w2"], module="TinyLM")


def _fed(values: list[float], number: int = 0, data: bool = True) -> dict:
    return _ev("tp_input", plan="train.py:30#1", number=number, grad=True, data=data,
               rows=len(values), fingerprint=values, layout="")


def test_tp4_ranks_of_one_group_fed_different_inputs() -> None:
    from course_lib.xray.detectors import tensor_parallel

    plan = _tp_plan([0, 1])
    apart = _run([plan, _fed([1.0, 2.0])], [plan, _fed([3.0, 4.0])])
    findings = _found(tensor_parallel, apart)
    assert [(f.id, f.where) for f in findings] == [("TP4", "train.py:7")]
    assert "rank 0 fed values [1, 2]" in findings[0].evidence
    assert _found(tensor_parallel, _run([plan, _fed([1.0, 2.0])], [plan, _fed([1.0, 2.0])])) == []
    # a plan that lays the input out sharded over the group (PrepareModuleInput) feeds each
    # rank its own share on purpose: its batches are not compared
    sharded = {**_fed([], data=False), "layout": "(Shard(dim=0),)"}
    other = _run([plan, sharded, _pass(0, [0, 1], "t.py:5")], [plan, sharded,
                                                                _pass(0, [2, 3], "t.py:5")])
    assert _found(tensor_parallel, other) == []
    # an activation (autograd history) is not the data: dropout may differ there (TP5)
    inner = _run([plan, _fed([1.0], data=False)], [plan, _fed([2.0], data=False)])
    assert _found(tensor_parallel, inner) == []
    assert RULES["TP4"].verdict(inner) == Unjudged("TP4", (
        "no forward of the parallelized model and no training pass over a DataLoader ran on "
        "every rank of a tensor-parallel group"))


def test_tp4_names_the_seeds_that_made_different_inputs() -> None:
    from course_lib.xray.detectors import tensor_parallel

    plan = _tp_plan([0, 1])

    def seeded(value: int) -> dict:
        event = _ev("seed", value=value)
        event["where"] = "train.py:30"
        return event
    found = _found(tensor_parallel, _run([plan, seeded(1234), _fed([1.0])],
                                         [plan, seeded(1235), _fed([2.0])]))
    assert [(f.id, f.where) for f in found] == [("TP4", "train.py:30")]
    assert "torch.manual_seed at train.py:30: 1234 on rank 0, 1235 on rank 1" in found[0].evidence


def _dropped(values: list[float], rng: int) -> dict:
    return _ev("tp_dropout", number=0, p=0.1, fingerprint=values, rng=rng)


def test_tp5_different_masks_on_an_activation_the_group_holds_alike() -> None:
    """Only where the dropout's input is the same on the ranks (a replicated activation);
    inside the sharded layers each rank's slice differs, and so may its mask."""
    from course_lib.xray.detectors import tensor_parallel_steps

    plan = _tp_plan([0, 1])
    assert _ids(tensor_parallel_steps, _run([plan, _dropped([1.0, 2.0], 7)],
                                      [plan, _dropped([1.0, 2.0], 8)])) == [("TP5", "confirmed")]
    assert _ids(tensor_parallel_steps, _run([plan, _dropped([1.0, 2.0], 7)],
                                      [plan, _dropped([1.0, 2.0], 7)])) == []
    sharded = _run([plan, _dropped([1.0, 2.0], 7)], [plan, _dropped([3.0, 4.0], 8)])
    assert _ids(tensor_parallel_steps, sharded) == []
    assert RULES["TP5"].verdict(_run([plan], [plan])) == Unjudged(
        "TP5", "no dropout ran in training after parallelize_module")


def test_tp4_reads_the_training_batches_when_the_model_was_fed_activations() -> None:
    """Per-block parallelization: the blocks' inputs are activations, so each rank's first
    training batch says what it read; the fix goes where the sampler was made."""
    from course_lib.xray.detectors import tensor_parallel

    plan = _tp_plan([0, 1])
    sampler = _ev("sampler", key=1, num_replicas=2, rank=0, shuffle=True, drop_last=False,
                  total_size=8, epoch=0, dataset_len=8)
    sampler["where"] = "train.py:40"
    run = _run([plan, sampler, _pass(0, [3, 1, 0, 2], "train.py:50")],
               [plan, sampler, _pass(0, [7, 5, 4, 6], "train.py:50",
                                     distributed={"num_replicas": 2, "rank": 1,
                                                  "shuffle": True, "drop_last": False,
                                                  "total_size": 8, "epoch": 0})])
    findings = _found(tensor_parallel, run)
    assert [(f.id, f.where) for f in findings] == [("TP4", "train.py:40")]
    assert "rank 0 read samples [3, 1, 0, 2], rank 1 [7, 5, 4, 6]" in findings[0].evidence
    assert "the global world size and rank" in findings[0].evidence


def test_tp8_on_a_2d_mesh_hides_tp4_and_p03_compares_only_across_tp_groups() -> None:
    g01, g23 = _tp_plan([0, 1], [2, 2], ["dp", "tp"]), _tp_plan([2, 3], [2, 2], ["dp", "tp"])
    split = _run([g01, _fed([1.0])], [g01, _fed([2.0])], [g23, _fed([1.0])], [g23, _fed([2.0])])
    report = run_all(split)
    assert report.ids == ["TP8"]
    assert "num_replicas=mesh['dp'].size(), rank=mesh['dp'].get_local_rank()" in \
        report.findings[0].evidence
    assert Unjudged("TP4", "its symptom is explained by TP8's finding above") in \
        report.not_checked
    # the ranks of one group read the same samples, the two groups different ones: correct
    same = [_pass(0, [0, 1, 2, 3], "train.py:50"), _pass(0, [4, 5, 6, 7], "train.py:50")]
    ranks = [[g, p] for g, p in zip((g01, g01, g23, g23), (same[0], same[0], same[1], same[1]))]
    assert _found(data, _run(*ranks)) == []
    assert _found(data, _run(*[[g, same[0]] for g in (g01, g01, g23, g23)]))[0].id == "P03"


def test_p03_is_not_judged_when_every_rank_is_one_tensor_parallel_group() -> None:
    plan = _tp_plan([0, 1])
    run = _run([plan, _pass(0, [0, 1, 2, 3], "t.py:5")], [plan, _pass(0, [0, 1, 2, 3], "t.py:5")])
    assert RULES["P03"].verdict(run) == Unjudged("P03", (
        "every rank is in one tensor-parallel group, whose ranks must read the same samples "
        "(TP4)"))


def test_tp9_clip_grad_norm_over_dtensor_and_plain_parameters() -> None:
    from course_lib.launching.errors import DistributedError, RankFailure
    from course_lib.xray.detectors import tensor_parallel_steps

    tb = ('Traceback (most recent call last):\n  File "/tmp/train.py", line 56, in <module>\n'
          '    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n'
          '  File "/venv/site-packages/torch/nn/utils/clip_grad.py", line 41, in _no_grad_wrapper\n'
          'RuntimeError: aten._foreach_norm.Scalar: got mixed torch.Tensor and DTensor\n')
    run = _run([_tp_plan([0, 1])], [_tp_plan([0, 1])])
    run.error = DistributedError("rank failed", [RankFailure(
        0, "exception", "", "RuntimeError",
        "aten._foreach_norm.Scalar: got mixed torch.Tensor and DTensor", tb)])
    findings = _found(tensor_parallel_steps, run)
    assert [(f.id, f.where) for f in findings] == [("TP9", "/tmp/train.py:56")]
    assert "implicit_replication()" in findings[0].evidence
    run.error = None
    assert _found(tensor_parallel_steps, run) == []


def _schedule(scale_grads: bool, reduction: str, m: int = 4) -> dict:
    return _ev("pipeline_schedule", key=1, schedule="ScheduleGPipe", n_microbatches=m,
               scale_grads=scale_grads, loss="mse_loss", reduction=reduction)


def _pipe_step(last: bool, losses: int) -> dict:
    return _ev("pipeline_step", schedule=1, number=0, stages=2, stage=int(last), last=last,
               rows=32, losses_given=True, losses=losses)


def test_pp5_scale_grads_false_with_a_loss_that_averages() -> None:
    from course_lib.xray.detectors import pipeline

    def run(schedule: dict) -> RunEvents:
        return _run([schedule, _pipe_step(False, 0)], [schedule, _pipe_step(True, 4)])
    assert _ids(pipeline, run(_schedule(False, "mean"))) == [("PP5", "confirmed")]
    assert _ids(pipeline, run(_schedule(True, "mean"))) == []
    assert _ids(pipeline, run(_schedule(False, ""))) == []  # the learner's own loss: unknown
    assert _ids(pipeline, run(_schedule(False, "sum"))) == []
    assert ("PP5", "confirmed") not in _ids(pipeline, run(_schedule(False, "mean", m=1)))


def test_pp1_gpipe_with_fewer_micro_batches_than_stages() -> None:
    from course_lib.xray.detectors import pipeline

    def run(m: int, schedule: str = "ScheduleGPipe") -> RunEvents:
        made = {**_schedule(True, "mean", m=m), "schedule": schedule}
        steps = [{**_pipe_step(r == 3, 0), "stages": 4, "stage": r} for r in range(4)]
        return _run(*[[made, step] for step in steps])
    findings = _found(pipeline, run(2))
    assert [f.id for f in findings] == ["PP1"] and "3/5 = 60%" in findings[0].evidence
    assert _found(pipeline, run(4)) == [] and _found(pipeline, run(8)) == []
    assert _found(pipeline, run(2, "ScheduleInterleaved1F1B")) == []  # another formula


def test_the_pipeline_probe_reads_a_loss_function_s_reduction() -> None:
    import functools

    import torch
    import torch.nn.functional as F

    from course_lib.xray.probes.pipeline import describe_loss

    assert describe_loss(F.mse_loss) == ("mse_loss", "mean")
    assert describe_loss(torch.nn.CrossEntropyLoss(reduction="sum")) == ("CrossEntropyLoss",
                                                                         "sum")
    assert describe_loss(functools.partial(F.cross_entropy, reduction="none")) == (
        "cross_entropy", "none")
    assert describe_loss(lambda out, y: F.mse_loss(out, y) / 4)[1] == ""
    assert describe_loss(None) == ("", "")


def test_pp4_a_rank_without_the_last_stage_failed_on_its_empty_losses() -> None:
    from course_lib.launching.errors import DistributedError, RankFailure
    from course_lib.xray.detectors import pipeline

    tb = ('Traceback (most recent call last):\n  File "/tmp/train.py", line 38, in <module>\n'
          '    print(torch.stack(losses).mean())\n'
          'RuntimeError: stack expects a non-empty TensorList\n')
    def failed(rank: int) -> RunEvents:
        run = _run([_pipe_step(False, 0)], [_pipe_step(True, 4)])
        run.error = DistributedError("rank failed", [RankFailure(
            rank, "exception", "", "RuntimeError", "stack expects a non-empty TensorList", tb)])
        return run
    findings = _found(pipeline, failed(0))
    assert [(f.id, f.where) for f in findings] == [("PP4", "/tmp/train.py:38")]
    assert "rank 1's held 4" in findings[0].evidence
    assert _found(pipeline, failed(1)) == []  # the last stage's own error is another one
