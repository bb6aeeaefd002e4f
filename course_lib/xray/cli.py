"""python -m course_lib xray: x-ray a torchrun-style script (see --help)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys

from course_lib.xray import xray
from course_lib.xray.report import STATUSES

EPILOG = """\
The script runs as torchrun would run it: N processes with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set; its own init_process_group() call gets the launch's group
(with a short collective timeout, --pg-timeout, so that a hang ends). A script that cannot
train here (a GPU-only call on a CPU machine, its own mp.spawn, an early exit) is not
judged: the report's first line says why and what to do.

exit status:
""" + "\n".join(f"  {code}  {meaning}" for code, meaning in STATUSES.items()) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, x-ray the script, print the report; return the exit status."""
    from course_lib.launching.launcher import PG_TIMEOUT_MAX_S

    parser = argparse.ArgumentParser(
        prog="python -m course_lib xray", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a DDP training script on N ranks and report which of the course's "
                    "pitfalls it has, with evidence from the run.")
    parser.add_argument("--nproc-per-node", type=int, default=2, metavar="N",
                        help="ranks to run (default 2)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as one JSON object (the script's output goes "
                             "to stderr)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="stop the run after S seconds (default 120)")
    parser.add_argument("--pg-timeout", type=float, default=None, metavar="S",
                        help="a collective fails after waiting S seconds, so that a hang "
                             "ends (default: a quarter of --timeout, at most "
                             f"{PG_TIMEOUT_MAX_S:g})")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.script):
        parser.error(f"no such file: {args.script!r}")
    if args.nproc_per_node < 1:
        parser.error("--nproc-per-node must be at least 1")
    from course_lib.xray.on_rank import run_script

    fn = functools.partial(run_script, os.path.abspath(args.script), args.args, os.getcwd())
    title = f"X-ray of {args.script} on {args.nproc_per_node} rank(s)"
    out = sys.stderr if args.json else sys.stdout
    with contextlib.redirect_stdout(out):
        extra = {"pg_timeout": args.pg_timeout} if args.pg_timeout else {}
        report = xray(fn, args.nproc_per_node, timeout=args.timeout, title=title,
                      source=args.script, **extra)
    print(report.to_json() if args.json else f"\n{report}")
    return report.exit_status
