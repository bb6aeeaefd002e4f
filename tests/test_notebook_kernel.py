"""launch() and %%ddp from a real Jupyter kernel, as a learner uses them."""

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.kernel  # a kernel or a cold Python process: not in --quick

CELLS = [
    "import torch, torch.distributed as dist\nfrom course_lib import launch\n%load_ext course_lib",
    "SCALE = 3\n"
    "class Box:\n    def __init__(self, v):\n        self.v = v\n"
    "def helper(x):\n    return x * SCALE\n"
    "def work():\n    t = torch.tensor([float(dist.get_rank())])\n    dist.all_reduce(t)\n"
    "    print('sum', t.item())\n    return Box(helper(t.item()))",
    "run = launch(work, 2, backend='gloo')\n"
    "print([b.v for b in run.results], isinstance(run.results[0], Box))",
    "%%ddp -n 3 --backend gloo --env GREETING=hi --out ddp_run\nimport os\n"
    "x = torch.ones(1) * rank\ndist.all_reduce(x)\nprint(rank, world_size, local_rank, device)\n"
    "(x.item(), helper(1), os.environ['GREETING'])",
    "print(ddp_run.results == _, ddp_run.world_size)",
    "def broken():\n    if dist.get_rank() == 1:\n        raise ValueError('oops from a cell')\n"
    "    return 1\nlaunch(broken, 2, backend='gloo')",
    "import threading\nlock = threading.Lock()",
    "%%ddp --backend gloo\nwith lock:\n    pass",
    "import course_lib.launching.forkserver as fs\nprint('warmed up by', fs._warming.name)",
]


@pytest.fixture(scope="module")
def executed():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    for cell in nb.cells[5:6] + nb.cells[7:8]:
        cell.metadata["tags"] = ["raises-exception"]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return nb.cells


def _text(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_notebook_function_class_and_globals_travel(executed):
    out = _text(executed[2])
    assert "[rank 0] sum 1.0" in out and "[rank 1] sum 1.0" in out
    assert "[3.0, 3.0] True" in out


def test_ddp_magic_defines_rank_names_and_returns_last_expression(executed):
    cell = executed[3]
    out = _text(cell)
    for rank in range(3):
        assert f"[rank {rank}] {rank} 3 {rank} cpu" in out
    result = next(o for o in cell.outputs if o.output_type == "execute_result")
    assert result["data"]["text/plain"] == "[(3.0, 3, 'hi'), (3.0, 3, 'hi'), (3.0, 3, 'hi')]"
    assert _text(executed[4]).strip() == "True 3"


def test_error_in_a_cell_function_shows_its_source(executed):
    error = next(o for o in executed[5].outputs if o.output_type == "error")
    assert error["ename"] == "DistributedError"
    assert "rank 1" in error["evalue"] and "raise ValueError('oops from a cell')" in error["evalue"]
    # The rank's frame is named as the kernel names the cell (cell 6 ran as In[6]), whatever
    # cloudpickle does to file names (3.1.3 renames them all '<dynamic-code>').
    assert "Cell In[6], line 3, in broken" in error["evalue"]
    assert "<dynamic-code>" not in error["evalue"]


def test_magic_explains_a_name_it_cannot_send(executed):
    error = next(o for o in executed[7].outputs if o.output_type == "error")
    assert error["ename"] == "UnpicklableError"
    assert "'lock'" in error["evalue"] and "inside the %%ddp cell" in error["evalue"]


def test_importing_launch_in_a_kernel_warms_the_forkserver_up(executed):
    assert "warmed up by course_lib-warm-up" in _text(executed[8])
