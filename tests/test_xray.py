"""The x-ray on its case scripts: every buggy one shows exactly its pitfalls (confirmed),
every correct one shows none; the CLI's JSON shape and exit status."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.xray import cli

CASES = Path(__file__).parent / "xray_cases"


def torch_cuda_count() -> int:
    import torch

    return torch.cuda.device_count()

ROOT = Path(__file__).parent.parent


def expected(path: Path) -> set[str]:
    """The ids a case declares on its first line: `# expect: P03 P04` or `# expect: none`."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name}: first line must be '# expect: ...'"
    ids = first.split(":", 1)[1].split()
    return set() if ids == ["none"] else {i for i in ids if not i.endswith("?")}


def expected_suspicions(path: Path) -> set[str]:
    """Ids a case expects as suspicions only, marked with "?" (`# expect: P10?`): findings
    of a cost, not of an error."""
    ids = path.read_text().splitlines()[0].split(":", 1)[1].split()
    return {i[:-1] for i in ids if i.endswith("?")}


def header(path: Path, key: str) -> list[str]:
    """The words of a case's `# key: ...` line among its leading comment lines."""
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        if line.startswith(f"# {key}:"):
            return line.split(":", 1)[1].split()
    return []


def case_args(path: Path) -> list[str]:
    """Extra CLI arguments a case asks for: `# xray: --nproc-per-node 3`."""
    return header(path, "xray")


def rule_ids() -> set[str]:
    """Every id the x-ray judges: its rule table."""
    from course_lib.xray.detectors import rules

    return {r.id for r in rules()}


def run_case(path: Path, capsys) -> tuple[dict, int]:
    status = cli.main(["--json", "--timeout", "60", *case_args(path), str(path)])
    report = json.loads(capsys.readouterr().out)
    return report, status


@pytest.mark.parametrize("path", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_case(path: Path, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the checkpoint cases write their files here
    report, status = run_case(path, capsys)
    confirmed = {f["id"] for f in report["findings"] if f["certainty"] == "confirmed"}
    suspected = {f["id"] for f in report["findings"] if f["certainty"] == "suspected"}
    want, maybe = expected(path), expected_suspicions(path)
    assert confirmed == want, json.dumps(report, indent=1)
    if not want and not maybe:  # a correct script: no finding at all, not even a suspicion
        assert report["findings"] == [], json.dumps(report, indent=1)
        assert status == 0 and report["checked"]
        checked = {line.split()[0] for line in report["checked"]}
        assert set(header(path, "checks")) <= checked, json.dumps(report, indent=1)
    elif want:
        assert status == 1
    else:
        assert maybe <= suspected and status == 0, json.dumps(report, indent=1)
    for f in report["findings"]:
        assert f["evidence"] and f["lesson"].startswith("notebooks/"), f


def test_every_rule_has_a_buggy_and_a_correct_case() -> None:
    """Each rule is expected by a bad_<ID>_ case and checked by a good_ case (`# checks:`,
    verified when test_case runs it); no case names an id without a rule."""
    found = {p: expected(p) | expected_suspicions(p) for p in CASES.glob("bad_*.py")}
    bad = {pid for p, ids in found.items() for pid in ids & set(p.stem.split("_"))}
    good = {pid for p in CASES.glob("good_*.py") for pid in header(p, "checks")}
    rules = rule_ids()
    assert not rules - bad, f"rules without a bad_<ID>_ case: {sorted(rules - bad)}"
    assert not rules - good, f"rules no correct case checks: {sorted(rules - good)}"
    named = set().union(*found.values(), good)
    assert named <= rules, f"cases name unknown rules: {sorted(named - rules)}"


def _noted_kinds(module) -> set[str]:
    """The event kinds a module writes: the first argument of its record.note calls."""
    import ast
    import inspect

    return {node.args[0].value for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "note"
            and node.args and isinstance(node.args[0], ast.Constant)}


def test_every_rule_s_lesson_notebook_exists() -> None:
    """A finding's "read:" line is its pitfall's first lesson's notebook, from the registry's
    file names (not a glob of the installed package's folder)."""
    from course_lib.pitfalls import NOTEBOOKS, PITFALLS
    from course_lib.xray.report import finding

    assert [n for n in NOTEBOOKS.values() if not (ROOT / "notebooks" / n).is_file()] == []
    assert finding("P03", "e").lesson == "notebooks/03_data_sharding.ipynb"
    assert {PITFALLS[pid].notebook for pid in rule_ids()} <= {
        f"notebooks/{n}" for n in NOTEBOOKS.values()}


def test_a_rule_for_an_unknown_id_fails_at_import() -> None:
    from course_lib.xray.rules import rule

    with pytest.raises(ValueError, match="P99"):
        rule("P99", needs=("pass",))
    with pytest.raises(ValueError, match="unknown event kinds"):
        rule("P01", needs=("passes",))


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


def test_every_event_kind_has_a_schema_and_its_writer() -> None:
    """events.EVENTS names, for each kind, the probe whose record.note writes it, and every
    kind a rule needs is written by a probe (not only declared)."""
    from course_lib.xray.detectors import rules
    from course_lib.xray.events import EVENTS
    from course_lib.xray.probes import PROBES

    written = {k: p.__name__.rsplit(".", 1)[1] for p in PROBES for k in _noted_kinds(p)}
    written["probe_error"] = "record"  # record.guard's own
    assert written == {k: kind.writer for k, kind in EVENTS.items()}
    needed = {k for r in rules() for k in r.needs}
    assert needed <= set(written) and "probe_error" not in needed


def test_command_line_json_and_exit_status() -> None:
    """`python -m course_lib xray --json` prints one JSON object and exits 1 on a finding."""
    script = CASES / "bad_P03_no_sampler.py"
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib", "xray", "--nproc-per-node", "2", "--json",
         str(script)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    report = json.loads(proc.stdout)
    assert set(report) >= {"findings", "checked", "not_checked"}
    assert proc.returncode == 1
    finding = next(f for f in report["findings"] if f["id"] == "P03")
    assert set(finding) == {"id", "title", "evidence", "where", "lesson", "certainty"}
    assert finding["where"].startswith(os.path.relpath(script, ROOT))


def test_crash_gives_root_cause_first_and_findings_before_it(capsys) -> None:
    report, status = run_case(CASES / "bad_P03_then_crash.py", capsys)
    assert status == 1 and [f["id"] for f in report["findings"]] == ["P03"]
    assert report["error"].startswith("2 of 2 rank(s) failed. First failure: rank 1, "
                                      "RuntimeError: mat1 and mat2 shapes cannot be multiplied")


HANG = '''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print("waiting")  # on every rank: P16, seen only if the stopped rank's events come back
if int(os.environ["RANK"]) == 0:
    dist.all_reduce(torch.ones(1))
else:
    while not os.path.exists("/nonexistent/flag"):  # waits for a file nobody writes
        time.sleep(0.1)
'''


def test_hang_ends_at_the_timeout_with_the_desync_report(tmp_path, capsys) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    status = cli.main(["--json", "--timeout", "8", str(script)])
    report = json.loads(capsys.readouterr().out)
    assert status == 1, report
    assert "Desync report" in report["error"] and "hang.py" in report["error"]
    assert [(f["id"], f["certainty"]) for f in report["findings"]] == [
        ("P16", "confirmed"), ("S1", "suspected")]
    assert "rank 1 never issued it" in report["findings"][1]["evidence"]
    assert "time.sleep(0.1)" in report["error"]  # the stopped rank's stack


def test_notebook_function() -> None:
    """xray(fn) on a notebook-style function: its finding, and its Run's results."""
    from course_lib import xray

    report = xray(_every_rank_all_data, world_size=2, timeout=60)
    assert report.ids == ["P03"], str(report)
    assert report.findings[0].where.endswith(f"test_xray.py:{_LOADER_LINE}")
    assert report.run.results == [8, 8] and report.exit_status == 1
    assert "P03" in report._repr_html_()


def _every_rank_all_data() -> int:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)  # the same data on every rank
    model = torch.nn.Linear(4, 1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=4)  # _LOADER_LINE
    steps = 0
    for (x,) in loader:
        model(x).sum().backward()
        steps += 1
    return steps


_LOADER_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if line.endswith("# _LOADER_LINE"))


# X-DET: the model, checkpoint and amp detectors on hand-made observations (no launch): each
# rule fires on the run that shows its pitfall and stays quiet on the run beside it.

def _obs(*per_rank: list[dict]):
    """RunEvents of len(per_rank) ranks with these events."""
    from course_lib.xray.run_events import RunEvents
    return RunEvents(world_size=len(per_rank), events=dict(enumerate(per_rank)))


def _ev(kind: str, t: float = 0.0, **fields) -> dict:
    """An event as a probe writes it (it must match its schema in xray/events.py)."""
    from course_lib.xray.events import mismatch

    event = {"kind": kind, "where": "train.py:7", "t": t, **fields}
    assert not mismatch(event), mismatch(event)
    return event


def _detect(area, obs) -> list:
    """The findings of the rules declared in one detector module."""
    from course_lib.xray.detectors import rules

    found = [r.judge(obs) for r in rules() if r.judge.__module__ == area.__name__]
    return [f for f in found if f is not None]


def _ids(area, obs) -> list[tuple[str, str]]:
    return [(f.id, f.certainty) for f in _detect(area, obs)]


_COUNTS = {"synced": 1, "local": 0, "all_used": 1, "no_sync": 0}


def _step(step: int, grads: list[float], params: list[float], **counts) -> dict:
    counts = {**_COUNTS, **counts}
    counts.setdefault("accumulated", counts["synced"])
    return _ev("opt_step", step=step, opt="SGD#1", grads=grads, params=params, shapes="s",
               **counts)


def test_p08_needs_averaged_gradients_and_differing_replicas() -> None:
    from course_lib.xray.detectors import model
    same, other = [[1.0, 2.0], [3.0, 4.0]], [[1.5, 2.5], [3.5, 4.5]]
    averaged = _obs([_step(1, same, same)], [_step(1, same, other)])
    assert _ids(model, averaged) == [("P08", "confirmed")]
    independent = _obs([_step(1, same, same)], [_step(1, other, other)])
    assert _ids(model, independent) == []
    in_sync = _obs([_step(1, same, other)], [_step(1, same, other)])
    assert _ids(model, in_sync) == []
    # the first parameter's gradient averaged, the second's not: the second drifts apart
    partial = _obs([_step(3, same, same)], [_step(3, [same[0], other[1]], [same[0], other[1]])])
    findings = _detect(model, partial)
    assert [f.id for f in findings] == ["P08"] and "1 of 2 parameters differ" in \
        findings[0].evidence


def test_p09_counts_synced_backwards_per_step() -> None:
    from course_lib.xray.detectors import model
    def steps(synced: int, local: int) -> list[dict]:
        return [_step(i, [[1.0, 1.0]], [[1.0, 1.0]], synced=synced, local=local)
                for i in range(1, 5)]
    findings = _detect(model, _obs(steps(4, 0), steps(4, 0)))
    assert [f.id for f in findings] == ["P09"]
    assert "16 backward passes" in findings[0].evidence and "4 optimizer steps" in \
        findings[0].evidence
    assert _ids(model, _obs(steps(1, 3), steps(1, 3))) == []
    # a GAN's discriminator: its gradients were all-reduced in the generator's step too,
    # but zero_grad() dropped them: one backward per step counts
    gan = [_step(i, [[1.0, 1.0]], [[1.0, 1.0]], synced=2, accumulated=1) for i in (1, 2)]
    assert _ids(model, _obs(gan, gan)) == []


def test_p10_find_unused_without_unused_parameters_is_a_suspicion() -> None:
    from course_lib.xray.detectors import model
    ddp = _ev("ddp", find_unused=True, static_graph=False, params=4, batchnorm=[],
              sync_batchnorm=[])
    steps = [_step(i, [[1.0, 1.0]], [[1.0, 1.0]]) for i in range(1, 4)]
    assert _ids(model, _obs([ddp, *steps], [ddp, *steps])) == [("P10", "suspected")]
    unused = _ev("ddp_unused", names=["aux.weight"], count=1, of=4)
    assert _ids(model, _obs([ddp, *steps, unused], [ddp, *steps])) == []


def test_p05_small_per_rank_batches_only() -> None:
    from course_lib.xray.detectors import model
    def bn(batch: int) -> dict:
        return _ev("batchnorm", layer="bn1", cls="BatchNorm2d", batch=batch, layer_id=1)
    assert _ids(model, _obs([bn(4), bn(8)], [bn(8)])) == [("P05", "confirmed")]
    assert _ids(model, _obs([bn(4), bn(64)], [bn(64)])) == []  # a short last batch


def _save(t: float, **fields) -> dict:
    return _ev("save", t, **{"path": "/run/ckpt.pt", "prefixed": 0, "keys": 4,
                             "t_end": t + 0.01, "size": 100, "collectives": 2,
                             "ddp_forwards": 3, "ddp_backwards": 3, **fields})


def _load(t: float, **fields) -> dict:
    return _ev("load", t, **{"path": "/run/ckpt.pt", "size": 100, "t_end": t + 0.01,
                             "collectives": 2, "ddp_forwards": 3, "ddp_backwards": 3,
                             **fields})


def test_p15_a_load_no_collective_orders_after_the_save() -> None:
    from course_lib.xray.detectors import checkpoint
    lucky = _obs([_save(1.0), _load(1.02)], [_load(1.015)])
    assert _ids(checkpoint, lucky) == [("P15", "confirmed")]
    barrier = _obs([_save(1.0), _load(1.02, collectives=3)], [_load(1.015, collectives=3)])
    assert _ids(checkpoint, barrier) == []
    failed = _obs([_save(1.0), _load(1.02)],
                  [_load(1.001, size=-1, error="FileNotFoundError: no such file")])
    assert _ids(checkpoint, failed) == [("P15", "confirmed")]


def test_p15_resuming_at_start_is_not_a_race() -> None:
    """Every rank tries the checkpoint at start (none yet), rank 0 saves at the end."""
    from course_lib.xray.detectors import checkpoint
    missing = {"size": -1, "error": "FileNotFoundError: no such file", "collectives": 0,
               "ddp_forwards": 0, "ddp_backwards": 0}
    obs = _obs([_load(0.1, **missing), _save(0.5)], [_load(0.1, **missing)])
    assert _ids(checkpoint, obs) == []


def test_p12_prefixed_keys_into_a_plain_model() -> None:
    from course_lib.xray.detectors import checkpoint
    def loaded(wrapper: bool, prefixed: int, **outcome) -> dict:
        return _ev("load_state_dict", **{"module": "Net", "wrapper": wrapper,
                                         "prefixed": prefixed, "keys": 4, "strict": True,
                                         **outcome})
    plain = _obs([loaded(False, 4, error="RuntimeError: Error(s)\n\tUnexpected key(s) in "
                                            "state_dict: \"module.w\"")], [])
    findings = _detect(checkpoint, plain)
    assert [f.id for f in findings] == ["P12"] and "Unexpected key(s)" in findings[0].evidence
    assert _detect(checkpoint, _obs([loaded(True, 4, missing=0, unexpected=0)], [])) == []
    assert _detect(checkpoint, _obs([loaded(False, 0, missing=0, unexpected=0)], [])) == []
    # a model with its own submodule named 'module' loads its 'module.' keys cleanly
    assert _detect(checkpoint, _obs([loaded(False, 4, missing=0, unexpected=0)], [])) == []
    lenient = _detect(checkpoint, _obs([loaded(False, 4, strict=False, missing=4,
                                             unexpected=4)], []))
    assert [f.id for f in lenient] == ["P12"] and "4 of the model's keys" in lenient[0].evidence


def test_s3_fp16_without_scaler_and_zero_gradients() -> None:
    from course_lib.xray.detectors import amp
    fp16 = _ev("autocast", device="cpu", dtype="float16", training=True)
    steps = [_ev("opt_step", step=i, opt="SGD#1", zero=99, values=100, max_abs=1e-7,
                 accumulated=1, **_COUNTS) for i in (1, 2)]
    assert _ids(amp, _obs([fp16, *steps], [fp16, *steps])) == [("S3", "confirmed")]
    scaled = _ev("scaler_scale")
    assert _ids(amp, _obs([fp16, scaled, *steps], [fp16, scaled, *steps])) == []
    healthy = [_ev("opt_step", step=1, opt="SGD#1", zero=1, values=100, max_abs=0.1,
                   accumulated=1, **_COUNTS)]
    assert _ids(amp, _obs([fp16, *healthy], [fp16, *healthy])) == [("S3", "suspected")]
    bf16 = _ev("autocast", device="cpu", dtype="bfloat16", training=True)
    assert _ids(amp, _obs([bf16, *steps], [bf16, *steps])) == []


def test_a_failing_probe_never_breaks_the_run() -> None:
    """A bug in a probe's bookkeeping is kept as an event and reported, not raised."""
    from course_lib.xray import record
    from course_lib.xray.detectors import run_all
    from course_lib.xray.run_events import RunEvents

    record.clear()
    with record.guard():
        raise KeyError("fingerprints")
    events = list(record.events())
    record.clear()
    assert [e["kind"] for e in events] == ["probe_error"]
    assert events[0]["probe"] == ""  # raised here, not inside a probe module
    report = run_all(RunEvents(world_size=2, events={0: events, 1: []}))
    assert any("a probe failed on rank 0 (KeyError" in line for line in report.not_checked)


def _train_with_a_broken_probe(probe: str) -> None:
    """A small DDP run that exercises every probe, with record.note raising whenever the
    named probe module calls it (a bug in that probe's bookkeeping)."""
    import sys
    import tempfile

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from course_lib.xray import record

    real = record.note

    def note(kind, where_=None, **fields):
        if sys._getframe(1).f_globals["__name__"] == f"course_lib.xray.probes.{probe}":
            raise RuntimeError(f"broken {probe} probe")
        return real(kind, where_, **fields)

    record.note = note
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
        print(f"loss {loss.item():.3f}")
    with tempfile.TemporaryDirectory() as folder:
        torch.save(model.module.state_dict(), f"{folder}/m.pt")
        model.module.load_state_dict(torch.load(f"{folder}/m.pt"))


@pytest.mark.parametrize("probe", ["data", "output", "collectives", "ddp", "optim",
                                   "checkpoint", "amp"])
def test_a_broken_probe_says_could_not_check_and_never_breaks_the_run(probe) -> None:
    """Every probe's bookkeeping runs under record.guard: the run returns, and each id the
    probe feeds is listed under "Could not check", never judged on missing events."""
    import functools

    from course_lib import xray
    from course_lib.xray.detectors import rules
    from course_lib.xray.events import EVENTS

    report = xray(functools.partial(_train_with_a_broken_probe, probe), world_size=2,
                  timeout=60)
    assert report.failure is None, str(report)
    fed = [r.id for r in rules() if any(EVENTS[k].writer == probe for k in r.needs)]
    assert fed
    for pid in fed:
        assert any(line.startswith(f"{pid}: the x-ray's {probe} probe failed on rank")
                   for line in report.not_checked), str(report)
        assert pid not in report.ids and not any(c.startswith(pid) for c in report.checked)


def test_a_run_s_events_match_their_schemas() -> None:
    """Every event a real DDP run's probes wrote has its kind's fields (xray/events.py)."""
    from course_lib import xray
    from course_lib.xray.events import mismatch
    from course_lib.xray.on_rank import COLLECTOR

    report = xray(functools.partial(_train_with_a_broken_probe, "no probe"), world_size=2,
                  timeout=60)
    events = [e for extras in report.run.extras for e in extras[COLLECTOR]]
    assert [mismatch(e) for e in events if mismatch(e)] == []
    assert {"loader", "pass", "sampler", "set_epoch", "print", "collective", "ddp_buffer_sync",
            "ddp", "batchnorm", "opt_step", "autocast", "save", "load",
            "load_state_dict"} <= {e["kind"] for e in events}


def test_a_notebook_cell_is_named_as_ipython_names_it(monkeypatch):
    import types

    import IPython

    from course_lib.launching.cells import cell_name, name_cell_paths, name_cells

    names = {"/tmp/ipykernel_7/123.py": ("Cell", "In[4]")}
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(format_code_name=names.get))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    assert cell_name("/tmp/ipykernel_7/123.py:5") == "Cell In[4], line 5"
    assert cell_name("train.py:12") == "train.py:12"
    assert cell_name("") == ""
    assert name_cell_paths("a sampler made at /tmp/ipykernel_7/123.py:2 was never given") == \
        "a sampler made at Cell In[4], line 2 was never given"
    frame = 'File "/tmp/ipykernel_7/123.py", line 5, in boom'
    assert name_cells(f'  {frame}\n  File "train.py", line 2, in f') == \
        '  Cell In[4], line 5, in boom\n  File "train.py", line 2, in f'
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # not in a kernel
    assert cell_name("/tmp/ipykernel_7/123.py:5") == "/tmp/ipykernel_7/123.py:5"


CANNOT_RUN = {
    "gpu_only": ("import os, torch\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n",
                 "Cannot run here: the script makes a GPU-only call"),
    "needs_args": ("import argparse\np = argparse.ArgumentParser()\n"
                   "p.add_argument('--data', required=True)\np.parse_args()\n",
                   "Cannot run here: the script's own argument parser stopped it (the "
                   "following arguments are required: --data)"),
    "spawn_none": ("import torch, torch.multiprocessing as mp\ndef train(rank):\n    pass\n"
                   "if __name__ == '__main__':\n"
                   "    mp.spawn(train, nprocs=torch.cuda.device_count())\n",
                   "Nothing was launched: mp.spawn(train, nprocs=0)"),
    "exits_early": ("import sys, torch\nif torch.cuda.device_count() < 2:\n"
                    "    print('need 2 GPUs')\n    sys.exit(0)\n",
                    "The script did not train: every rank ended normally, after printing "
                    "'need 2 GPUs'"),
}


@pytest.mark.skipif(torch_cuda_count() > 0, reason="written for a machine without a GPU")
@pytest.mark.parametrize("name", sorted(CANNOT_RUN))
def test_a_script_that_cannot_run_here_says_why_first(name, tmp_path, capsys) -> None:
    source, cause = CANNOT_RUN[name]
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    status = cli.main(["--json", "--timeout", "30", str(script)])
    report = json.loads(capsys.readouterr().out)
    assert report["cause"].startswith(cause), report
    assert status == 2 or report["findings"], report
    assert report["checked"] == []  # a run that died or never trained proves no absence


XRAY_CELL = """
def every_rank_all_data():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
"""


def test_a_finding_from_a_notebook_cell_names_the_cell_and_line(monkeypatch):
    """A function compiled as IPython compiles a cell keeps its file through the launch, and
    the finding's where reads as IPython's tracebacks do: 'Cell In[7], line 4'."""
    import types

    import IPython
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    from course_lib import xray

    filename = "/tmp/ipykernel_0/course-xray-cell.py"
    names = {filename: ("Cell", "In[7]")}
    shell = types.SimpleNamespace(compile=types.SimpleNamespace(format_code_name=names.get))
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    namespace = {"torch": torch, "DDP": DDP, "DataLoader": DataLoader,
                 "TensorDataset": TensorDataset, "__name__": "__main__"}
    exec(compile(XRAY_CELL, filename, "exec"), namespace)
    report = xray(namespace["every_rank_all_data"], world_size=2, timeout=60)
    assert report.ids == ["P03"], str(report)
    assert report.findings[0].where == "Cell In[7], line 5"


def test_a_finding_in_a_module_of_the_script_names_that_module(tmp_path, capsys,
                                                               monkeypatch) -> None:
    """A multi-file script (a trainer module beside main.py, as pytorch/examples' minGPT-ddp
    is): the where line names the file the collective came from, not main.py."""
    case = (CASES / "bad_X3_rank0_eval_through_ddp.py").read_text()
    (tmp_path / "trainer.py").write_text(case.replace('if __name__ == "__main__":\n    main()',
                                                      ""))
    (tmp_path / "main.py").write_text("from trainer import main\n\nmain()\n")
    monkeypatch.chdir(tmp_path)
    status = cli.main(["--json", "--timeout", "60", "main.py"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and [f["id"] for f in report["findings"]] == ["X3"], report
    line = next(n for n, text in enumerate(case.splitlines(), 1) if "val = " in text)
    assert report["findings"][0]["where"] == f"trainer.py:{line}", report
