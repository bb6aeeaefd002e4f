"""scripts/slurm/train.sbatch, run here with stand-ins for srun and scontrol: the torchrun
command it builds really trains on two stand-in nodes (two torchrun agents on this machine,
a c10d rendezvous on loopback); each job gets its own rendezvous port; srun is given the
task's CPUs. Not run on Slurm."""

import os
import re
import subprocess
import sys

from course_lib.teach.torchrun import SLURM_TEMPLATE

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
# srun: note its options and environment, then start the command once per node, in parallel.
SRUN = """#!/bin/bash
echo "srun $* SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-unset}" \
     "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-unset}"
while [[ $1 == -* ]]; do shift; done
for node in $(seq 0 $((SLURM_NNODES - 1))); do SLURM_NODEID=$node "$@" & done
rc=0
for pid in $(jobs -p); do wait "$pid" || rc=1; done
exit $rc
"""


def sbatch(tmp_path, job_id, *args, **env):
    """Run the template as sbatch would, with stand-ins for srun and scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": job_id,
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[01-02]",
           "SLURM_CPUS_PER_TASK": "16", "GLOO_SOCKET_IFNAME": "lo", **env}
    for name in ("SLURM_GPUS_ON_NODE", "RDZV_PORT", "GPUS_PER_NODE", "NPROC_PER_NODE"):
        if name not in env:
            env.pop(name, None)
    return subprocess.run(["bash", str(SLURM_TEMPLATE), *args], env=env, capture_output=True,
                          text=True, timeout=150)


def test_the_template_is_a_bash_script_with_its_sbatch_lines():
    text = SLURM_TEMPLATE.read_text()
    assert text.startswith("#!/bin/bash")
    assert "#SBATCH --ntasks-per-node=1" in text and "--rdzv-id \"$SLURM_JOB_ID\"" in text
    subprocess.run(["bash", "-n", str(SLURM_TEMPLATE)], check=True)


def test_each_job_has_its_own_port_and_srun_gets_the_tasks_cpus(tmp_path):
    """Two jobs whose first node is the same machine must not meet at one store; srun does
    not inherit --cpus-per-task on Slurm 22.05 and later (Slurm's release notes)."""
    ports = []
    for job_id in ("4242", "4243"):
        done = sbatch(tmp_path, job_id, "train.py", TORCHRUN="echo torchrun")
        assert done.returncode == 0, done.stderr[-2000:]
        ports += re.findall(r"--rdzv-endpoint 127\.0\.0\.1:(\d+)", done.stdout)[:1]
        assert "srun --cpus-per-task=16 " in done.stdout
        assert "SRUN_CPUS_PER_TASK=16 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in done.stdout
    assert len(ports) == 2 and ports[0] != ports[1], ports
    # below Linux's default ephemeral range (32768-60999), which outgoing connections use
    assert all(10000 <= int(p) < 32768 for p in ports), ports


def test_the_torchrun_command_it_builds_trains_on_two_nodes(tmp_path):
    """No GPUs on the stand-in nodes: one worker per node, 2 ranks in all."""
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "result.txt"
    done = sbatch(tmp_path, str(4242 + os.getpid() % 10000), str(tmp_path / "train.py"),
                  str(out), TORCHRUN=f"{sys.executable} -m torch.distributed.run",
                  JOIN_TIMEOUT="60", READ_TIMEOUT="20", OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert re.search(r"job \d+: 2 nodes x 1 workers \(0 GPUs per node\), rendezvous at "
                     r"127\.0\.0\.1:\d+", done.stdout), done.stdout
    assert out.read_text() == "2 3"  # 2 ranks, 1 + 2
