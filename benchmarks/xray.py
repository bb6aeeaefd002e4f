"""What the x-ray adds to a training script's run time (the target: at most 2x).

Run:  .venv/bin/python benchmarks/xray.py          (about 2 minutes on 2 cores)
The script: a typical learner's torchrun script (DDP around a 32-64-1 MLP, a DataLoader
with DistributedSampler over 4096 samples, batch 32, 3 epochs with set_epoch, an evaluation
pass with an all-reduce, rank 0 prints). It runs under `torchrun --standalone`, under the
course's launcher without probes, and under `python -m course_lib xray` (every probe
installed), in turn, so the machine's load falls on all alike. Two figures: the whole
command's wall time, and the script's own training time (its main() timed by the script,
slower rank), where the probes do their work. x-ray/launcher is the probes' cost on the
same kind of rank; x-ray/torchrun is what a learner sees against their usual command (the
launcher's ranks fork from a process that already imported torch, so they start faster).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAIRS = 4
ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''
import os, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 32), torch.randn(4096, 1))
    val = TensorDataset(torch.randn(1024, 32), torch.randn(1024, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        total = torch.zeros(1)
        with torch.no_grad():
            for x, y in val_loader:
                total += torch.nn.functional.mse_loss(model(x), y, reduction="sum")
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} val loss {total.item() / len(val):.4f}")


dist.init_process_group("gloo")
start = time.perf_counter()
main()
print(f"TRAIN_SECONDS {time.perf_counter() - start:.4f}")
'''


# The same script on the course's launcher without the probes: the x-ray's own ranks start
# the same way (forked from a forkserver that imported torch), so this isolates the probes.
LAUNCHER = ("import functools; from course_lib.launching import launch; "
            "from course_lib.xray.on_rank import run_script; "
            "launch(functools.partial(run_script, {script!r}, []), 2)")


def run(command: list[str]) -> tuple[float, float]:
    """(wall seconds of the command, the slower rank's training seconds)."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    # not after a quote: the x-ray's P16 evidence quotes the printed line ('TRAIN_SECONDS ...')
    found = re.findall(r"(?<!')TRAIN_SECONDS (\d+\.\d{4})", proc.stdout + proc.stderr)
    train = [float(s) for s in found]
    if len(train) != 2:
        raise RuntimeError(f"{command} gave no timings:\n{proc.stdout}\n{proc.stderr}")
    return wall, max(train)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "train.py")
        Path(script).write_text(SCRIPT)
        plain = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", script]
        launcher = [sys.executable, "-c", LAUNCHER.format(script=script)]
        xray = [sys.executable, "-m", "course_lib", "xray", "--nproc-per-node", "2", script]
        commands = {"torchrun": plain, "launcher": launcher, "x-ray": xray}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(PAIRS):
            for name, command in commands.items():
                results[name].append(run(command))
    print(f"median of {PAIRS} runs each{'':<4}{'torchrun':>10}{'launcher':>10}{'x-ray':>10}"
          f"{'x-ray/torchrun':>16}{'x-ray/launcher':>16}")
    for i, what in enumerate(["whole command, wall s", "script's training, s"]):
        t, lr, x = (statistics.median(r[i] for r in results[n]) for n in commands)
        print(f"{what:<24}{t:>10.2f}{lr:>10.2f}{x:>10.2f}{x / t:>15.2f}x{x / lr:>15.2f}x")


if __name__ == "__main__":
    main()
