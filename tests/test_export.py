"""python -m course_lib export: a notebook's function becomes a script torchrun runs."""

import ast
import json
import subprocess
import sys

import pytest

from course_lib.export import ExportError, export, main
from course_lib.teach.torchrun import TORCHRUN, TorchrunFailed, free_port, start, wait


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
    "    print(os.getpid(), telemetry, helper(steps), math.pi)\n",
)


def test_the_script_holds_what_the_function_needs_and_nothing_else(tmp_path):
    text = export(notebook(tmp_path, *CELLS), "train")
    ast.parse(text)
    assert "def helper(x):\n    return x * SCALE  # keep me" in text  # comments kept
    assert "SCALE = 3" in text and "import math" in text
    assert "from course_lib import telemetry" in text  # not launch: it starts a forkserver
    assert "launch" not in text and "def unused" not in text and "%load_ext" not in text
    assert 'parser.add_argument("out_dir")' in text
    assert 'parser.add_argument("--steps", type=int, default=2)' in text
    assert 'parser.add_argument("--lr", type=float, default=0.5)' in text
    assert 'parser.add_argument("--flag", action=argparse.BooleanOptionalAction' in text
    assert 'parser.add_argument("--seed", type=str, default=None)' in text


def test_the_script_refuses_to_run_outside_torchrun(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *CELLS), "train"))
    env = {k: v for k, v in __import__("os").environ.items() if k != "RANK"}
    done = subprocess.run([sys.executable, str(script), "out"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "RANK is not set: start this script with torchrun" in done.stderr


def test_restarts_on_the_shared_store_stop_with_the_fix(tmp_path):
    """--max-restarts with the agent's shared store fails restarts 1 time in 3 on one node
    and 2 in 3 on two (review of lesson 14, e14 scripts): the script says what to set."""
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path, *CELLS), "train"))
    env = {**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1"}
    done = subprocess.run([sys.executable, str(script), "out"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in done.stderr


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


def test_the_script_chooses_gloo_when_the_node_has_fewer_gpus_than_processes(tmp_path):
    text = export(notebook(tmp_path, *GROUP_CELLS), "train")
    assert "if here <= gpus:" in text and "torch.cuda.set_device(local_rank)" in text
    assert "TORCHELASTIC_RESTART_COUNT" not in text.split("def main")[1]
