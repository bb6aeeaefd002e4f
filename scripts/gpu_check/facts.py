"""The run's facts for the summary (OUT/env.json): date, command, commit, torch, GPUs, cores.

Usage (scripts/gpu-check calls it):  python -m gpu_check.facts OUT/env.json ROOT COMMAND
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

NOT_A_CHECKOUT = "not a git checkout"


def _git(root: Path, *args: str) -> str | None:
    """git's answer in `root`, or None when git fails or is missing."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def project_commit(root: Path) -> str:
    """The project's commit, read only from its own repository: a copy without .git gets
    'not a git checkout', even inside another repository (whose commit git would give)."""
    if not (root / ".git").exists():
        return NOT_A_CHECKOUT
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return NOT_A_CHECKOUT
    commit = _git(root, "rev-parse", "--short", "HEAD") or "? (no commit yet)"
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return commit + (" with uncommitted changes" if changed else "")


def machine_facts(root: Path, command: str) -> dict[str, Any]:
    """What the summary's header says about this run and this machine."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "command": command.strip(), "commit": project_commit(root),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0], "gpu_count": len(gpus),
            "gpus": ", ".join(gpus) or "none", "cores": os.cpu_count()}


if __name__ == "__main__":
    out, root, command = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    Path(out).write_text(json.dumps(machine_facts(root, command)))
