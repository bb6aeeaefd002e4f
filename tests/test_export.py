"""python -m course_lib export: a notebook's function becomes a script torchrun runs, on a
machine with torch and without the course."""

import ast
import inspect
import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

from course_lib import devices
from course_lib.export import ExportError, export, main
from course_lib.export.carry import STAND_IN
from course_lib.teach.torchrun import TORCHRUN, TorchrunFailed, free_port, start, wait
from course_lib.telemetry import Recorder


def notebook(tmp_path, *sources):
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": s} for s in sources]
    cells.insert(1, {"cell_type": "markdown", "metadata": {}, "source": "# prose"})
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


CELLS = (
    "import math\nimport os\nfrom course_lib import launch, telemetry\n%load_ext course_lib",
    "SCALE = 3\n\ndef helper(x):\n    return x * SCALE  # keep me\n",
    "def unused():\n    return launch\n",
    "def train(out_dir, steps=2, lr=0.5, name='a', flag=False, seed=None):\n"
    "    print(os.getpid(), telemetry.Recorder(), helper(steps), math.pi)\n",
)


def test_the_script_holds_what_the_function_needs_and_nothing_else(tmp_path):
    text = export(notebook(tmp_path, *CELLS), "train")
    ast.parse(text)
    assert "def helper(x):\n    return x * SCALE  # keep me" in text  # comments kept
    assert "SCALE = 3" in text and "import math" in text
    assert "launch" not in text and "def unused" not in text and "%load_ext" not in text
    assert 'parser.add_argument("out_dir")' in text
    assert 'parser.add_argument("--steps", type=int, default=2)' in text
    assert 'parser.add_argument("--lr", type=float, default=0.5)' in text
    assert 'parser.add_argument("--flag", action=argparse.BooleanOptionalAction' in text
    assert 'parser.add_argument("--seed", type=str, default=None)' in text


def test_the_script_refuses_to_run_outside_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *CELLS), "train"))
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    done = subprocess.run([sys.executable, str(script), "out"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "RANK is not set: start this script with torchrun" in done.stderr


def test_restarts_on_the_shared_store_stop_with_the_fix(tmp_path):
    """--max-restarts with the agent's shared store fails restarts 1 time in 3 on one node
    and 2 in 3 on two (review of lesson 14, e14 scripts): the script says what to set, as
    an exception that @record writes to torchrun's error file (a sys.exit would not be)."""
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *CELLS), "train"))
    error_file = tmp_path / "error.json"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1",
           "TORCHELASTIC_ERROR_FILE": str(error_file)}
    done = subprocess.run([sys.executable, str(script), "out"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in done.stderr
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in error_file.read_text()


@pytest.mark.parametrize("cells, message", [
    ((CELLS[0],), "no function 'train' defined"),
    (("def train(x=[1]):\n    pass",), "is not a number, a string, a bool or None"),
    (("def train(*args):\n    pass",), "use plain parameters"),
])
def test_bad_input_gets_a_clear_error(tmp_path, cells, message):
    with pytest.raises(ExportError, match=message):
        export(notebook(tmp_path, *cells), "train")


def test_the_command_line_writes_the_script_or_says_why_not(tmp_path, capsys):
    path = notebook(tmp_path, *CELLS)
    assert main([str(path), "--function", "train", "-o", str(tmp_path / "t.py")]) == 0
    assert (tmp_path / "t.py").exists()
    assert main([str(path), "--function", "nope", "-o", str(tmp_path / "u.py")]) == 2
    assert "export: no function 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "u.py").exists()


GROUP_CELLS = (
    "import os\nimport torch\nimport torch.distributed as dist",
    "def train(out_dir, fail=False):\n"
    "    if fail:\n        raise ValueError('train failed on purpose')\n"
    "    t = torch.ones(1)\n    dist.all_reduce(t)\n"
    "    open(os.path.join(out_dir, f'rank{dist.get_rank()}'), 'w').write(f'{t.item():g}')\n",
)


def test_nodes_that_restarted_a_different_number_of_times_still_meet(tmp_path):
    """TORCHELASTIC_RESTART_COUNT is per node: a node restarted for a membership change keeps
    its count (torch/distributed/elastic/agent/server/api.py: 'membership changes do not count
    as retries'). The script must not build its store keys from it: here two ranks get counts
    0 and 1, as two nodes did in the review's run, and must still form the group."""
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *GROUP_CELLS), "train"))
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2",
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    nodes = [start([sys.executable, str(script), str(tmp_path)], f"node {r}",
                   {**base, "RANK": str(r), "GROUP_RANK": str(r),
                    "TORCHELASTIC_RESTART_COUNT": str(r)}) for r in (0, 1)]
    wait(*nodes, timeout=90, echo=False)  # before the fix: still running after 90 s
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["2", "2"]
    assert "gloo on the CPU: 0 GPU(s) for 1 processes on this node" in nodes[0].output


def test_a_worker_error_reaches_torchruns_summary_with_its_traceback(tmp_path):
    """main() is decorated with @record: torchrun's summary quotes the worker's error
    instead of 'error_file: <N/A>' and a link to the docs."""
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *GROUP_CELLS), "train"))
    job = start(f"{TORCHRUN} --standalone --nproc-per-node 1 {script} {tmp_path} --fail",
                env={"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    with pytest.raises(TorchrunFailed, match="exit code 1"):
        wait(job, timeout=90, echo=False)
    summary = job.output.split("Root Cause")[-1]
    assert "ValueError: train failed on purpose" in summary, job.output[-3000:]
    assert "To enable traceback" not in summary and "error_file: <N/A>" not in summary


def test_the_script_joins_by_the_course_rule_copied_from_devices(tmp_path):
    """main() calls devices.torchrun_backend, whose source (and that of what it calls) the
    script holds exactly as course_lib/devices.py has it: the two cannot drift."""
    text = export(notebook(tmp_path, *GROUP_CELLS), "train")
    assert "backend = torchrun_backend()" in text
    for fn in (devices.torchrun_backend, devices.backend_for, devices.bind, devices.device_for):
        assert inspect.getsource(fn) in text
    assert "TORCHELASTIC_RESTART_COUNT" not in text.split("def main")[1]


LESSON14_CELLS = (
    "import os\nimport torch\nimport torch.distributed as dist\nfrom torch import nn\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "from course_lib import launch, plots, rank_device, telemetry\n"
    "from course_lib.teach import checkpoints as ckpt",
    "def train(out_dir, steps=4, every=2):\n"
    "    rank, device = dist.get_rank(), rank_device()\n"
    "    os.makedirs(out_dir, exist_ok=True)\n"
    "    torch.manual_seed(0)\n"
    "    model = DDP(nn.Linear(4, 1).to(device))\n"
    "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "    rec = telemetry.Recorder()\n"
    "    step, last = 0, ckpt.latest_checkpoint(out_dir)\n"
    "    if last is not None:\n"
    "        step = ckpt.restore(ckpt.verified_load(last), model, optimizer)\n"
    "    while step < steps:\n"
    "        with rec.step(step):\n"
    "            model(torch.full((2, 4), float(rank + step), device=device)).sum().backward()\n"
    "            optimizer.step()\n"
    "            optimizer.zero_grad()\n"
    "        step += 1\n"
    "        if step % every == 0:\n"
    "            state = ckpt.capture(step, model, optimizer)\n"
    "            if rank == 0:\n"
    "                ckpt.atomic_save(state, ckpt.checkpoint_path(out_dir, step))\n"
    "            dist.barrier()\n"
    "    weight = str(model.module.weight.sum().item())\n"
    "    open(os.path.join(out_dir, f'rank{rank}'), 'w').write(weight)\n",
)


def imports_outside_try(text):
    """The top-level modules the script imports for sure (an import inside try is optional)."""
    tree = ast.parse(text)
    found = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            found |= {a.name.split(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.ImportFrom):
            found.add(stmt.module.split(".")[0])
    return found


def test_the_default_script_imports_torch_and_the_standard_library_only(tmp_path):
    text = export(notebook(tmp_path, *LESSON14_CELLS), "train")
    third_party = imports_outside_try(text) - set(sys.stdlib_module_names)
    assert third_party == {"torch"}, third_party
    assert "def rank_device()" in text and "def capture(" in text and "def unwrap(" in text
    assert "ckpt = SimpleNamespace(atomic_save=atomic_save, capture=capture," in text
    assert STAND_IN.splitlines()[0] in text  # telemetry: the course's if installed, else none
    assert "plots" not in text and "launch" not in text
    assert "It imports torch (and the standard library)." in text
    # ckpt.capture gathers every rank's random state with two all_gathers, not
    # all_gather_object (which needs numpy): nothing says numpy is needed
    assert "It also needs numpy where it runs" not in text


def test_with_course_keeps_the_course_imports(tmp_path):
    text = export(notebook(tmp_path, *LESSON14_CELLS), "train", with_course=True)
    assert "from course_lib import rank_device, telemetry" in text
    assert "from course_lib.teach import checkpoints as ckpt" in text
    assert "from course_lib.devices import torchrun_backend" in text
    assert "def capture(" not in text and "It imports course_lib, torch" in text


def test_the_telemetry_stand_in_answers_what_a_recorder_returns():
    """The stand-in covers every Recorder method whose value a training loop uses: a
    context manager (step, span) or the sampler back (watch_sampler). The others return
    None there, which is what the stand-in's __getattr__ gives; what a loop does not use
    the value of (telemetry, save, export) or never calls (layout, for the watchers) aside."""
    valued = {name for name, fn in inspect.getmembers(Recorder, inspect.isfunction)
              if not name.startswith("_")
              and inspect.signature(fn).return_annotation not in ("None", None)}
    namespace = {}
    exec(STAND_IN.format(alias="telemetry", as_alias="", function="f")
         .replace("from course_lib import", "from no_such_package import"),
         {"os": os, "contextlib": __import__("contextlib")}, namespace)
    stand_in = namespace["telemetry"].Recorder
    covered = {name for name in vars(stand_in) if not name.startswith("_")}
    assert valued - {"telemetry", "save", "export", "layout"} <= covered, valued - covered


@pytest.mark.parametrize("cells, message", [
    (("from course_lib import launch\ndef train():\n    launch(print, 2)",),
     "cannot carry: export with --with-course"),
    (("from course_lib.teach import checkpoints as ckpt\n"
      "def capture():\n    pass\n"
      "def train():\n    ckpt.capture(0, None, None)\n    capture()",),
     "capture: the notebook and the course_lib code that the script copies both define it"),
    (("from course_lib import telemetry\ndef train():\n    print(telemetry)",),
     "used as a module object"),
])
def test_what_cannot_be_copied_gets_a_clear_error(tmp_path, cells, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        export(notebook(tmp_path, *cells), "train")


def torch_only_venv(path):
    """A virtual environment that has torch and what torch requires, and nothing else (no
    course_lib, no numpy): links to this environment's copies, so nothing is downloaded."""
    python = path / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path / "venv")],
                   check=True, timeout=120)
    packages = next((path / "venv" / "lib").glob("python*/site-packages"))
    (packages / "torch_only.pth").write_text(str(linked(path / "torch", "torch")) + "\n")
    return python


def linked(folder, *distributions):
    """A folder of links to these distributions and what they require (extras aside; a
    requirement not installed here is one whose marker leaves this platform out: torch
    2.11's CUDA build requires triton, which asks for importlib-metadata on Python < 3.10)."""
    folder.mkdir(parents=True)
    seen, todo = set(), list(distributions)
    while todo:
        try:
            dist = metadata.distribution(todo.pop())
        except metadata.PackageNotFoundError:
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        todo += [re.match(r"[\w.-]+", r)[0] for r in dist.requires or [] if "extra ==" not in r]
        tops = {f.parts[0] for f in dist.files if not f.parts[0].endswith((".dist-info", ".pth"))
                and f.parts[0] != ".."}
        for top in tops:
            if not (folder / top).exists():
                (folder / top).symlink_to(dist.locate_file(top))
    return folder


ALL_GATHER_OBJECT = """
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
out = [None]
dist.all_gather_object(out, {"a": 1})
print(out)
"""


def test_an_exported_script_runs_where_only_torch_is_installed(tmp_path):
    """Issue 36 item 7: a script that uses plain collectives runs in a venv with torch and
    nothing else. And the fact behind the numpy line of a script's docstring: there, torch's
    own all_gather_object fails (distributed_c10d.py, _tensor_to_object)."""
    python = torch_only_venv(tmp_path / "env")
    probe = subprocess.run([str(python), "-c", "import course_lib"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert "No module named 'course_lib'" in probe.stderr  # the positive control
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *GROUP_CELLS), "train"))
    assert "numpy" not in script.read_text()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": ""}
    done = subprocess.run([str(python), str(script), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "rank0").read_text() == "1"
    gather = subprocess.run([str(python), "-c", ALL_GATHER_OBJECT], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "RuntimeError: Numpy is not available" in gather.stderr, gather.stderr[-2000:]


def test_lesson_14s_kind_of_script_resumes_under_torchrun_without_the_course(tmp_path):
    """The lesson 14 kind of train() (rank_device, telemetry, checkpoints) exported and run
    with torchrun --standalone --nproc-per-node 2 where only torch is installed (no course_lib,
    no numpy), twice: the second run resumes from the first one's
    checkpoints (the copied helpers) and ends with the uninterrupted run's weights."""
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *LESSON14_CELLS), "train"))
    python = torch_only_venv(tmp_path / "env")
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""}
    torchrun = f"{python} -m torch.distributed.run --standalone --nproc-per-node 2"
    first = wait(start(f"{torchrun} {script} {tmp_path / 'a'} --steps 2", env=env),
                 timeout=180, echo=False)[0]
    assert "course_lib is not installed here: telemetry records nothing" in first.output
    assert "gloo on the CPU: 0 GPU(s) for 2 processes on this node" in first.output
    assert sorted(p.name for p in (tmp_path / "a").glob("step-*.pt")) == ["step-00000002.pt"]
    wait(start(f"{torchrun} {script} {tmp_path / 'a'} --steps 4", env=env), timeout=180,
         echo=False)
    wait(start(f"{torchrun} {script} {tmp_path / 'b'} --steps 4", env=env), timeout=180,
         echo=False)
    resumed = [(tmp_path / "a" / f"rank{r}").read_text() for r in (0, 1)]
    straight = [(tmp_path / "b" / f"rank{r}").read_text() for r in (0, 1)]
    assert resumed == straight and resumed[0] == resumed[1]
