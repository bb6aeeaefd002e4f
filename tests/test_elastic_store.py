"""What lesson 14 says about elastic restarts: torchrun 2.13 keeps one store across restarts
(same MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True), so restarted gloo workers that join
the default group on it may read the addresses of the workers that died. Without a prefix
("plain" below), 10 restarts on this machine: 4 failed ("Gloo connectFullMesh failed ...
Connection refused"), 2 hung until killed at 100 s, 4 worked: a race, so no test asserts
the failure. A store prefix per restart attempt (what `course_lib export` writes into
main()) makes the restart work; this test runs it."""

from course_lib.teach.torchrun import TORCHRUN, run

SCRIPT = """
import os, signal, sys
import torch
import torch.distributed as dist

attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if sys.argv[1] == "prefix":
    store, rank, world_size = next(dist.rendezvous("env://"))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                            rank=rank, world_size=world_size)
else:
    dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if attempt == "0" and dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # one worker dies after the group was built
dist.all_reduce(t)
print(f"attempt {attempt} rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
"""
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def restart(tmp_path, mode):
    script = tmp_path / "restart.py"
    script.write_text(SCRIPT)
    return run(f"{TORCHRUN} --standalone --nproc-per-node 2 --max-restarts 1 {script} {mode}",
               env=ENV, timeout=120, echo=False)


def test_a_prefix_per_attempt_makes_the_restart_work(tmp_path):
    job = restart(tmp_path, "prefix")
    text = "\n".join(job.lines)  # torchrun may join two workers' lines into one
    assert "attempt 1 rank 0 done" in text and "attempt 1 rank 1 done" in text, text[-3000:]
