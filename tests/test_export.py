"""python -m course_lib export: a notebook's function becomes a script torchrun runs."""

import ast
import json
import subprocess
import sys

import pytest

from course_lib.export import ExportError, export, main


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
