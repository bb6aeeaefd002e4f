"""scripts/slurm/train.sbatch: run here with stand-ins for srun and scontrol, the torchrun
command it builds really trains (one node, 2 workers, a c10d rendezvous on loopback)."""

import os
import subprocess
import sys

from course_lib.teach.torchrun import SLURM_TEMPLATE, free_port

SCRIPT = """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
if dist.get_rank() == 0:
    open(sys.argv[1], "w").write(f"{dist.get_world_size()} {t.item():g}")
dist.destroy_process_group()
"""


def test_the_template_is_a_bash_script_with_its_sbatch_lines():
    text = SLURM_TEMPLATE.read_text()
    assert text.startswith("#!/bin/bash")
    assert "#SBATCH --ntasks-per-node=1" in text and "--rdzv-id \"$SLURM_JOB_ID\"" in text
    subprocess.run(["bash", "-n", str(SLURM_TEMPLATE)], check=True)


def test_the_torchrun_command_it_builds_runs_on_this_machine(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')  # one task: this node
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node[01]", "GPUS_PER_NODE": "2",
           "RDZV_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
           "TORCHRUN": f"{sys.executable} -m torch.distributed.run",
           "JOIN_TIMEOUT": "30", "READ_TIMEOUT": "10"}
    out = tmp_path / "result.txt"
    done = subprocess.run(["bash", str(SLURM_TEMPLATE), str(tmp_path / "train.py"), str(out)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "job 4242: 1 nodes x 2 workers, rendezvous at 127.0.0.1:" in done.stdout
    assert out.read_text() == "2 3"  # 2 ranks, 1 + 2
