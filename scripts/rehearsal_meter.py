"""What each learner of scripts/workshop_rehearsal.py uses: their single-user server and
every process under it, sampled while they work (CPU-seconds, peak PSS and RSS)."""

from __future__ import annotations

import psutil


def server_tree(name: str) -> list[psutil.Process]:
    """The learner's single-user server and everything under it."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any("jupyterhub-singleuser" in part for part in proc.info["cmdline"] or []) \
                    and proc.environ().get("JUPYTERHUB_USER") == name:
                return [proc, *proc.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return []


class Meter:
    """Samples each learner's processes. CPU-seconds: a process still there at the last
    sample counts its own time and its reaped children's; one that was reaped by a process
    of the tree is counted in its parent's children time, the rest by its last reading.
    Memory: the peak of the proportional set sizes (PSS: a page shared by k processes
    counts 1/k in each) summed over the tree, and of the resident sets (RSS, shared pages
    counted in every process: an upper bound)."""

    def __init__(self, names: list[str]):
        self.seen: dict[str, dict[int, tuple[int, float, float]]] = {n: {} for n in names}
        self.alive: dict[str, set[int]] = {n: set() for n in names}
        self.peak = dict.fromkeys(names, 0)
        self.peak_rss = dict.fromkeys(names, 0)

    def sample(self) -> None:
        for name, seen in self.seen.items():
            pss, rss, alive = 0, 0, set()
            for proc in server_tree(name):
                try:
                    t = proc.cpu_times()
                    seen[proc.pid] = (proc.ppid(), t.user + t.system,
                                      t.children_user + t.children_system)
                    memory = proc.memory_full_info()
                    pss, rss = pss + memory.pss, rss + memory.rss
                    alive.add(proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.alive[name] = alive
            self.peak[name] = max(self.peak[name], pss)
            self.peak_rss[name] = max(self.peak_rss[name], rss)

    def cpu_seconds(self, name: str) -> float:
        seen, alive = self.seen[name], self.alive[name]
        return sum(own + children for pid, (ppid, own, children) in seen.items()
                   if pid in alive or ppid not in seen)
