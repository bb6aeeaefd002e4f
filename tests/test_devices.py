"""course_lib/devices.py, the one rule for devices and backends, and every caller of it
agreeing, on faked GPU counts and CUDA_VISIBLE_DEVICES values.

The fake is torch's own counting: `torch.cuda.device_count()` runs for real, with only the
driver's answers replaced (`_is_compiled`, NVML's raw count and UUIDs). So
CUDA_VISIBLE_DEVICES is parsed by torch itself (`torch.cuda._parse_visible_devices`), and
the tests check devices.named_gpus against it. Not run on a GPU.
"""

import ast
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib import devices
from course_lib.checks.lesson02 import pick_device
from course_lib.checks.lesson14 import main_check
from course_lib.launching import own_init, rank_main
from course_lib.launching.devices import rank_device as reexported
from course_lib.launching.validate import choose_backend
from course_lib.teach import buckets
from course_lib.teach.torchrun import node_gpus
from course_lib.telemetry import Recorder

UUIDS = [f"GPU-{i}aaaaaaa-0000-0000-0000-00000000000{i}" for i in range(4)]


@pytest.fixture
def machine(monkeypatch):
    """A machine with `n` GPUs, as torch counts them before CUDA starts (NVML)."""
    def with_gpus(n):
        monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
        monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", lambda: n)
        monkeypatch.setattr(torch.cuda, "_raw_device_uuid_nvml", lambda: UUIDS[:n])
        monkeypatch.setattr(torch.cuda, "_initialized", False)
        monkeypatch.setattr(torch.cuda, "_cached_device_count", None)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return with_gpus


ORDINALS = ["", "0", "1", "0,1", "1,0", "0,1,2,3", "0,1,7", "7,0", "-1", "0,-1,1", "1gpu,2",
            "+1", "0,0", " 1, 2", "none"]
UUID_LISTS = [UUIDS[1], f"{UUIDS[0]},{UUIDS[2]}", f"{UUIDS[1]},0", f"{UUIDS[3]},{UUIDS[3]}"]


@pytest.mark.parametrize("gpus, value", [(g, v) for g in (0, 1, 2, 4) for v in ORDINALS]
                         + [(4, v) for v in UUID_LISTS])
def test_visible_gpus_counts_as_torch_does_in_the_started_process(machine, monkeypatch,
                                                                  gpus, value):
    """What the kernel predicts for a launch's env (visible_gpus(env)) is what torch counts
    in a process whose environment holds that value. (A UUID is counted as named, up to
    this process's GPUs: without asking NVML, a UUID the machine lacks counts too.)"""
    machine(gpus)
    predicted = devices.visible_gpus({"CUDA_VISIBLE_DEVICES": value})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert predicted == torch.cuda.device_count()
    assert devices.visible_gpus() == torch.cuda.device_count()


def test_the_fake_counts_gpus_and_an_empty_value_hides_them(machine, monkeypatch):
    """A positive control for the fake above: it is torch's counting, not a constant."""
    machine(4)
    assert torch.cuda.device_count() == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert torch.cuda.device_count() == 0


def test_without_cuda_visible_devices_a_launch_sees_the_kernels_gpus(machine):
    machine(3)
    assert devices.visible_gpus() == devices.visible_gpus({"OMP_NUM_THREADS": "1"}) == 3


@pytest.mark.parametrize("ranks, gpus, backend", [
    (1, 0, "gloo"), (2, 0, "gloo"), (1, 1, "nccl"), (2, 1, "gloo"), (2, 2, "nccl"),
    (4, 8, "nccl"), (3, 2, "gloo"), (0, 4, "gloo"),
])
def test_backend_for_needs_a_gpu_for_each_rank_of_the_machine(ranks, gpus, backend):
    assert devices.backend_for(ranks, gpus) == backend
    expected = torch.device("cuda", 1) if backend == "nccl" else torch.device("cpu")
    assert devices.device_for(backend, 1) == expected


# (GPUs on the machine, the launch's CUDA_VISIBLE_DEVICES or None, ranks) -> backend
LAUNCHES = [
    (0, None, 2, "gloo"), (1, None, 1, "nccl"), (1, None, 2, "gloo"), (2, None, 2, "nccl"),
    (4, "", 1, "gloo"), (4, "", 2, "gloo"),  # GPUs hidden from a stand-in's ranks
    (4, "0", 1, "nccl"), (4, "0", 2, "gloo"), (4, "2,3", 2, "nccl"), (2, "1,5", 2, "gloo"),
    (8, "0,1,2,3", 4, "nccl"), (2, UUIDS[1], 1, "nccl"),
]


@pytest.mark.parametrize("gpus, value, ranks, backend", LAUNCHES)
def test_every_caller_agrees_on_the_backend(machine, monkeypatch, capsys, gpus, value,
                                            ranks, backend):
    """The kernel (choose_backend with the launch's env), a rank under the launcher
    (rank_main binds its GPU by it, own_init refuses NCCL by it) and a process that
    torchrun started (the exported script's main) reach the same answer."""
    machine(gpus)
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert choose_backend("auto", ranks, env) == backend
    # now inside a rank: its environment holds the launch's env
    for key, val in env.items():
        monkeypatch.setenv(key, val)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    bound = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    assert devices.torchrun_backend() == backend
    assert devices.bind(backend, 0) == (torch.device("cuda", 0) if backend == "nccl" else None)
    assert bound == ([torch.device("cuda", 0)] * 2 if backend == "nccl" else [])
    if ranks:
        monkeypatch.setattr(own_init, "_group", own_init._LaunchGroup(None, 0, ranks, 10.0))
        monkeypatch.setattr(dist, "is_initialized", lambda: False)
        monkeypatch.setattr(dist, "PrefixStore", lambda *a: None)
        monkeypatch.setattr(own_init, "real_init_process_group", lambda *a, **k: None)
        monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
        if backend == "gloo":
            with pytest.raises(RuntimeError, match="needs one GPU per rank"):
                own_init.init_process_group("nccl")
        else:
            own_init.init_process_group("nccl")  # accepted: the group starts
    capsys.readouterr()


def test_the_launcher_rank_binds_its_gpu_through_devices_bind():
    """rank_main._init_process_group takes the device from devices.bind (the one place)."""
    import inspect

    source = inspect.getsource(rank_main._init_process_group)
    assert "devices.bind(spec.backend, spec.rank)" in source and "set_device" not in source


def test_hiding_gpus_in_env_picks_gloo_and_says_nothing(machine, capsys):
    machine(4)
    assert choose_backend("auto", 2, {"CUDA_VISIBLE_DEVICES": ""}) == "gloo"
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="this launch's env leaves its ranks 0 GPU"):
        choose_backend("nccl", 2, {"CUDA_VISIBLE_DEVICES": ""})


def _backend_and_device():
    return dist.get_backend(), str(devices.rank_device())


def test_a_launch_that_hides_the_gpus_runs_on_gloo_on_a_gpu_machine(machine, capsys):
    """The launcher passes its env to the rule: on a (faked) 4-GPU kernel, the stand-in's
    launch with CUDA_VISIBLE_DEVICES="" runs gloo ranks on the CPU, and says nothing."""
    from course_lib import launch

    machine(4)
    assert choose_backend("auto", 2, {}) == "nccl"  # the same kernel, GPUs not hidden
    run = launch(_backend_and_device, 2, env={"CUDA_VISIBLE_DEVICES": ""}, echo=False)
    assert run.results == [("gloo", "cpu")] * 2
    assert "backend=" not in capsys.readouterr().out


def test_gpus_short_in_env_says_so_naming_the_env(machine, capsys):
    machine(4)
    assert choose_backend("auto", 2, {"CUDA_VISIBLE_DEVICES": "3"}) == "gloo"
    assert "this launch's env leaves its ranks 1." in capsys.readouterr().out


@pytest.mark.parametrize("backend, local_rank, device", [
    ("nccl", "1", torch.device("cuda", 1)), ("gloo", "1", torch.device("cpu")),
    (None, "0", torch.device("cpu")),
])
def test_rank_device_follows_the_group(monkeypatch, backend, local_rank, device):
    monkeypatch.setattr(dist, "is_initialized", lambda: backend is not None)
    monkeypatch.setattr(dist, "get_backend", lambda: backend)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert devices.rank_device() == reexported() == device


@pytest.mark.parametrize("gpus, want", [(0, ""), (1, ""), (2, "1"), (4, "1")])
def test_simulated_nodes_each_get_a_gpu_only_when_there_is_one_per_node(machine, gpus, want):
    machine(gpus)
    assert node_gpus(1, 2) == {"CUDA_VISIBLE_DEVICES": want}


def test_the_hints_state_the_rule_from_devices():
    assert devices.RULE in pick_device.CPU_RULE
    assert devices.RULE in main_check.NCCL_HINT


# -- timing ---------------------------------------------------------------------------------

class FakeEvent:
    """A CUDA event on a fake GPU whose timer reads `gpu_ms` when the event is recorded."""

    gpu_ms = 0.0

    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = FakeEvent.gpu_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.at - self.at


@pytest.fixture
def fake_cuda(monkeypatch):
    """A process that uses CUDA: every synchronize is counted, events are FakeEvents."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(devices, "_anchor", None)
    return syncs


def test_a_cpu_process_never_touches_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronized"))
    devices.wait_for_gpu()
    assert isinstance(devices.timestamp(lambda: 5.0), float)


def test_a_gpu_timestamp_reads_the_gpu_timer_against_an_anchor(fake_cuda):
    FakeEvent.gpu_ms = 1000.0
    devices.start_gpu_clock(lambda: 50.0)  # the GPU timer's 1000 ms is the clock's 50 s
    assert fake_cuda == [None]
    FakeEvent.gpu_ms = 1250.0
    stamp = devices.timestamp(lambda: 99.0)  # the clock's "now" is not what counts
    assert isinstance(stamp, devices.GpuTime) and float(stamp) == 50.25
    assert fake_cuda == [None]  # taking it waited for nothing


def test_spans_wait_for_the_gpu_at_both_edges(fake_cuda):
    rec = Recorder(enabled=False)
    rec.enabled = True
    with rec.span("step"):
        assert len(fake_cuda) == 1
    assert len(fake_cuda) == 2


def test_timed_backward_stamps_gradients_on_the_gpu_and_waits_at_its_edges(fake_cuda):
    model = torch.nn.Linear(3, 1)
    rec = Recorder(enabled=False)
    loss = model(torch.ones(2, 3)).sum()
    FakeEvent.gpu_ms = 0.0
    devices.start_gpu_clock(lambda: 100.0)
    rows = []
    rec.record_row = lambda table, *values: rows.append((table, *values))
    buckets.timed_backward(rec, model, loss)
    assert len(fake_cuda) == 3  # the anchor, then before and after backward
    (_, _, name, start, last), (_, _, wait, last2, end) = rows
    assert (name, wait) == ("backward", "wait for all-reduce") and last == last2 == 100.0


def test_exported_gpu_times_become_seconds(fake_cuda):
    from course_lib.telemetry import recorder

    FakeEvent.gpu_ms = 0.0
    devices.start_gpu_clock(lambda: 10.0)
    FakeEvent.gpu_ms = 500.0
    assert recorder._plain(devices.timestamp(lambda: 0.0)) == 10.5


def test_nothing_in_the_course_chooses_a_device_from_cuda_alone():
    """Every device and backend decision goes through devices.py: no other module of the
    package calls torch.cuda's count, availability or set_device, except the doctor's GPU
    row and the checkpoints' CUDA random state (neither decides a device)."""
    root = Path(devices.__file__).parent
    allowed = {"devices.py", "doctor.py", "teach/checkpoints.py"}
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("device_count", "is_available", "set_device")
                    and ast.unparse(node.func.value).endswith("cuda") and rel not in allowed):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert found == []
