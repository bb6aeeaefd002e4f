"""The %%ddp cell magic: run a cell's body on every rank."""

from __future__ import annotations

import ast
import linecache
import os
import types
from itertools import count
from typing import Any

import torch.distributed as dist
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from course_lib.launching.devices import rank_device
from course_lib.launching.launcher import launch
from course_lib.launching.payload import UnpicklableError, dumps

RANK_NAMES = ("rank", "world_size", "local_rank", "device")
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}
_cells = count(1)


def run_cell_body(source: str, filename: str, namespace: dict[str, Any]) -> Any:
    """Inside a worker: run the cell with rank names defined; return its last expression."""
    namespace.update(rank=dist.get_rank(), world_size=dist.get_world_size(),
                     local_rank=int(os.environ["LOCAL_RANK"]), device=rank_device())
    body, last = _split_last_expression(source)
    exec(compile(body, filename, "exec"), namespace)
    return eval(compile(last, filename, "eval"), namespace) if last else None


def _split_last_expression(source: str) -> tuple[ast.Module, ast.Expression | None]:
    tree = ast.parse(source)
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        return tree, ast.Expression(last.value)
    return tree, None


def referenced_names(source: str) -> set[str]:
    """Every global name the cell's code (nested functions and classes included) uses."""
    names: set[str] = set()
    todo = [compile(source, "<cell>", "exec")]
    while todo:
        code = todo.pop()
        names.update(code.co_names)
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def capture_namespace(source: str, user_ns: dict[str, Any]) -> dict[str, Any]:
    """The notebook names the cell uses, each checked to travel to the workers by value."""
    captured = {}
    for name in sorted(referenced_names(source) & user_ns.keys()):
        if name.startswith("_") or name in _IPYTHON_NAMES or name in RANK_NAMES:
            continue
        value = user_ns[name]
        try:
            dumps(value)
        except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same advice
            raise UnpicklableError(
                f"the cell uses {name!r} (a {type(value).__name__}), which cannot be sent to "
                f"the worker processes: {exc}. Create it inside the %%ddp cell instead."
            ) from None
        captured[name] = value
    return captured


@magics_class
class DDPMagics(Magics):
    """%%ddp [-n N] [--timeout S] [--backend B] [--env K=V ...] [--out NAME] [--fresh]"""

    @magic_arguments()
    @argument("-n", "--nproc", type=int, default=2, help="number of ranks (default 2)")
    @argument("--timeout", type=float, default=60, help="seconds before the run is stopped")
    @argument("--backend", default="auto", help="auto (default), gloo or nccl")
    @argument("--env", action="append", default=[], metavar="KEY=VALUE",
              help="environment variable for every rank (repeatable)")
    @argument("--out", default=None, help="keep the Run object in this notebook variable")
    @argument("--fresh", action="store_true",
              help="start new ranks even when ready ones wait (see launch's fresh)")
    @cell_magic
    def ddp(self, line: str, cell: str) -> Any:
        """Run this cell on every rank, with rank, world_size, local_rank and device defined.

        The notebook's names the cell uses are copied to the ranks; names the cell
        assigns stay on the ranks. The cell's last expression is returned per rank.
        """
        opts = parse_argstring(self.ddp, line)
        env = dict(_parse_env(item) for item in opts.env)
        filename = f"<%%ddp cell {next(_cells)}>"
        linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
        user_ns = self.shell.user_ns if self.shell is not None else {}  # always a shell's
        namespace = capture_namespace(cell, user_ns)
        run = launch(run_cell_body, opts.nproc, args=(cell, filename, namespace),
                     timeout=opts.timeout, backend=opts.backend, env=env, fresh=opts.fresh)
        if opts.out:
            user_ns[opts.out] = run
        _, last = _split_last_expression(cell)
        return run.results if last else None


def _parse_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--env expects KEY=VALUE, got {item!r}")
    return key, value
