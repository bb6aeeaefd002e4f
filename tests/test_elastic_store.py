"""Elastic restarts of the script `course_lib export` writes, on two torchrun agents on this
machine (two "nodes"), as lesson 14 and scripts/slurm/train.sbatch run them.

The case that broke the old per-attempt store prefix: node 1's worker dies while node 0's
worker is busy outside a collective (an NCCL rank in a kernel, a long data step). Node 1's
agent restarts its workers as a failure (TORCHELASTIC_RESTART_COUNT=1); node 0's agent
restarts them as a membership change, which does not count (torch/distributed/elastic/agent/
server/api.py: "membership changes do not count as retries"), so its count stays 0. With
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, every rendezvous round gets a fresh store on a new
port (dynamic_rendezvous.py, next_rendezvous: RendezvousStoreInfo.build without the shared
server's port), and a plain init_process_group needs no prefix at all."""

import json

from course_lib.export import export
from course_lib.teach.torchrun import TORCHRUN, free_port, start, wait

CELLS = [
    "import os, signal, time\nimport torch\nimport torch.distributed as dist",
    "def train(out_dir):\n"
    "    rank = dist.get_rank()\n"
    "    count = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
    "    t = torch.ones(1)\n"
    "    dist.all_reduce(t)\n"
    "    first = os.path.join(out_dir, 'killed')\n"
    "    if rank == 1 and not os.path.exists(first):\n"
    "        open(first, 'w').close()\n"
    "        os.kill(os.getpid(), signal.SIGKILL)  # node 1's worker dies\n"
    "    elif not os.path.exists(first + '.seen'):\n"
    "        open(first + '.seen', 'w').close()\n"
    "        time.sleep(8)  # node 0's worker is busy, not in a collective\n"
    "    dist.all_reduce(t)\n"
    "    print(f'rank {rank} count {count} done {t.item():g}', flush=True)\n",
]
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "",
       "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def notebook(tmp_path):
    path = tmp_path / "nb.ipynb"
    cells = [{"cell_type": "code", "metadata": {}, "source": s} for s in CELLS]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_two_nodes_restart_when_their_restart_counts_differ(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(export(notebook(tmp_path), "train"))
    port = free_port()
    node = (f"{TORCHRUN} --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-id t14 "
            f"--rdzv-endpoint 127.0.0.1:{port} --max-restarts 1 --monitor-interval 1 "
            "--rdzv-conf join_timeout=60,read_timeout=30")
    nodes = [start(f"{node}{conf} {script} {tmp_path}", f"node {n}", ENV)
             for n, conf in ((0, ""), (1, ",is_host=false"))]
    wait(*nodes, timeout=150, echo=False)
    text = "\n".join(job.output for job in nodes)  # torchrun may join two workers' lines
    assert "rank 0 count 0 done 4" in text and "rank 1 count 1 done 4" in text, text[-3000:]
