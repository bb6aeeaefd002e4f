"""The environment doctor: can this machine run the course? A pass/warn/fail table.

Its imports of torch and the launcher sit inside the checks, so that a broken torch
install is reported as a failed check rather than a traceback."""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class Check:
    name: str
    status: str
    detail: str


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("Python", PASS if ok else FAIL,
                 f"{platform.python_version()} ({sys.executable})" + ("" if ok else "; need 3.10+"))


def check_packages(for_gpu_check: bool = False) -> list[Check]:
    """The course's packages. scripts/gpu-check runs the notebooks with nbclient, so there
    JupyterLab is not needed (a GPU node often lacks it); a learner's machine needs it."""
    checks = []
    for package in ("torch", "jupyterlab", "ipywidgets", "matplotlib", "cloudpickle"):
        version = _version(package)
        if version:
            checks.append(Check(package, PASS, version))
        elif package == "jupyterlab" and for_gpu_check:
            checks.append(Check(package, SKIP, "not installed: not needed by the GPU check, "
                                               "which runs the notebooks with nbclient"))
        else:
            checks.append(Check(package, FAIL, "not installed: run the README's set-up command"))
    return checks


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"),
                     own: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in cores (a JupyterHub spawner's cpu_limit,
    docker --cpus), the tightest on the path to the root; None when there is none."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: cpu.max is "QUOTA PERIOD" or "max PERIOD"
            limits += _quotas(root, path, lambda d: (d / "cpu.max").read_text().split())
        elif "cpu" in controllers.split(","):  # v1: cfs_quota_us is -1 without a limit
            limits += _quotas(root / controllers, path, lambda d: [
                (d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text()])
    return min(limits) if limits else None


def _quotas(root: Path, path: str, read: Callable[[Path], list[str]]) -> list[float]:
    found = []
    folder = root / path.strip("/")
    for directory in (folder, *folder.parents):
        try:
            quota, period = (part.strip() for part in read(directory))
        except (OSError, ValueError):
            quota = period = ""
        if quota not in ("", "max", "-1") and period:
            found.append(int(quota) / int(period))
        if directory == root:
            break
    return found


def check_cores() -> Check:
    """Cores this process may use: the machine's, its CPU affinity and its cgroup quota."""
    machine = os.cpu_count() or 1
    usable: float = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else machine
    limit = cgroup_cpu_limit()
    detail = f"{usable:g}" + (f" (machine: {machine})" if usable != machine else "")
    if limit is not None and limit < usable:
        usable = limit
        detail = f"{limit:g} (a cgroup CPU limit, as a hub or container sets; machine: {machine})"
    if usable >= 2:
        return Check("CPU cores", PASS, detail)
    return Check("CPU cores", WARN, f"{detail}; ranks share less than 2 cores: lessons run "
                 "slower (about 2x at 1 core) but work")


def check_gpus() -> Check:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return Check("GPUs", PASS, "none: lessons run on CPU with gloo (as designed)")
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    nccl = "NCCL available" if dist.is_nccl_available() else "NCCL missing: gloo only"
    return Check("GPUs", PASS, f"{torch.cuda.device_count()}: {names}; {nccl}")


def check_backends() -> Check:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return Check("backends", FAIL, "torch.distributed or gloo missing from this torch build")
    found = [b for b in ("gloo", "nccl", "mpi") if getattr(dist, f"is_{b}_available")()]
    return Check("backends", PASS, ", ".join(found))


def check_loopback() -> Check:
    from course_lib.network import loopback_interface

    try:
        return Check("loopback interface", PASS, loopback_interface())
    except RuntimeError as exc:
        return Check("loopback interface", FAIL, str(exc))


def _smoke() -> dict:
    """Runs on each rank: one all-reduce, then report the sockets this rank holds."""
    import torch
    import torch.distributed as dist

    from course_lib.launching.sockets import non_loopback, socket_addresses

    t = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(t)
    addresses = socket_addresses()
    return {"sum": t.item(), "sockets": len(addresses), "outside": non_loopback(addresses)}


def check_launch() -> list[Check]:
    from course_lib.launching import DistributedError, launch

    start = time.perf_counter()
    try:
        run = launch(_smoke, world_size=2, backend="gloo", timeout=30, echo=False)
    except DistributedError as exc:
        return [Check("2-rank launch + all-reduce", FAIL, exc.headline)]
    took = time.perf_counter() - start
    ok = all(r["sum"] == 3.0 for r in run.results)
    outside = [a for r in run.results for a in r["outside"]]
    sockets = sum(r["sockets"] for r in run.results)
    return [
        Check("2-rank launch + all-reduce", PASS if ok else FAIL,
              f"sum of (rank+1) = {run.results[0]['sum']:g} (expected 3) in {took:.2f} s"),
        Check("listening addresses", FAIL if outside else PASS,
              f"non-loopback sockets: {outside}" if outside
              else f"all {sockets} rank sockets on loopback"),
    ]


_CELL = "def cell_fn():\n    raise ValueError('doctor: the learner line')\n"


def check_tracebacks() -> Check:
    """A rank's traceback must show a notebook cell's file and source line: the course
    relies on it (some package versions lose them, as cloudpickle 3.1.3 alone did)."""
    import linecache

    from course_lib.launching import DistributedError, launch

    filename = "/tmp/ipykernel_doctor/cell.py"
    linecache.cache[filename] = (len(_CELL), None, _CELL.splitlines(True), filename)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(_CELL, filename, "exec"), namespace)
    try:
        launch(namespace["cell_fn"], world_size=1, backend="gloo", timeout=30, echo=False)
    except DistributedError as exc:
        shown = exc.failures[0].traceback
        if filename in shown and "the learner line" in shown.split(filename)[-1]:
            return Check("rank tracebacks", PASS, "show the cell's file and source line")
        return Check("rank tracebacks", FAIL, "a rank's traceback lost the cell's file or "
                     "source line: reinstall with the README's set-up command; shown:\n"
                     + shown[-400:])
    return Check("rank tracebacks", FAIL, "a function that raises on its rank did not fail")


def check_peer(peer: str | None, listen_port: int | None, wait: float) -> Check:
    """--peer HOST:PORT or --listen PORT: the two ends of a multi-node reachability test."""
    from course_lib import network as reach

    if listen_port is not None:
        result = reach.listen(listen_port, wait)
        return Check(f"peer on port {listen_port}", PASS if result.ok else FAIL, result.detail)
    host, _, port = (peer or "").rpartition(":")
    if not host or not port.isdigit():
        return Check("peer", FAIL, f"--peer wants HOST:PORT, e.g. node0:29500, not {peer!r}")
    result = reach.probe(host, int(port), wait)
    return Check(f"peer {peer}", PASS if result.ok else FAIL, result.detail)


def run_doctor(checks: list[Callable[[], Check | list[Check]]] | None = None,
               for_gpu_check: bool = False) -> list[Check]:
    """Run the checks (default: all of a learner's machine's) in order."""
    results: list[Check] = []
    packages = functools.partial(check_packages, for_gpu_check)
    for check in checks or (check_python, packages, check_cores, check_gpus,
                            check_backends, check_loopback, check_launch, check_tracebacks):
        out = check()
        results.extend(out if isinstance(out, list) else [out])
    return results


def format_table(results: list[Check], verdict: str = "ready for the course") -> str:
    width = max(len(c.name) for c in results)
    lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{c.name:<{width}}  {c.status:<6}  {c.detail}" for c in results]
    failed = [c.name for c in results if c.status == FAIL]
    lines.append("")
    lines.append(f"FAILED: {', '.join(failed)}" if failed else f"All checks passed: {verdict}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib doctor: print the table; exit 1 when a check failed."""
    parser = argparse.ArgumentParser(prog="python -m course_lib doctor",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--peer", metavar="HOST:PORT",
                        help="only check that HOST:PORT is reachable from here and back "
                             "(run `doctor --listen PORT` on HOST first)")
    parser.add_argument("--listen", metavar="PORT", type=int,
                        help="only answer one `doctor --peer` on PORT (before a multi-node "
                             "launch, on the rendezvous node)")
    parser.add_argument("--wait", type=float, default=10.0,
                        help="seconds to wait for the other side (default 10)")
    parser.add_argument("--for-gpu-check", action="store_true",
                        help="as scripts/gpu-check runs it: JupyterLab is not needed there")
    args = parser.parse_args(argv or [])
    if args.peer or args.listen:
        results = run_doctor([lambda: check_peer(args.peer, args.listen, args.wait)])
        print(format_table(results, "both directions reach (this checks the network only)"))
    else:
        results = run_doctor(for_gpu_check=args.for_gpu_check)
        print(format_table(results, "ready for the GPU check" if args.for_gpu_check
                           else "ready for the course"))
    return 1 if any(c.status == FAIL for c in results) else 0
