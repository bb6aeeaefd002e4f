"""python -m course_lib export NOTEBOOK --function NAME -o SCRIPT: a function written in a
notebook becomes a script that torchrun runs, unchanged.

The script holds the notebook's imports that the function needs, the function, and the
other top-level definitions it uses (functions, classes, constants), found by reading the
code, not by running it. Its `main()` reads RANK, LOCAL_RANK and WORLD_SIZE from the
environment (torchrun sets them, with MASTER_ADDR and MASTER_PORT), joins the process group
(NCCL on cuda:LOCAL_RANK when the node has a GPU per process, else gloo on the CPU, said in
one line), calls the function with the command line's arguments (one per parameter, typed by
the default value), and leaves the group, also when the function raised. `@record` sends a
worker's traceback to torchrun's error summary. Never imports torch itself.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path


class ExportError(ValueError):
    """The notebook or the function cannot become a script; the message says what to do."""


def code_cells(notebook: str | Path) -> list[str]:
    """The sources of the notebook's code cells, lines of IPython syntax (%, !) left out."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    sources = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return ["\n".join(ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!")))
            for src in sources]


def top_level(sources: list[str]) -> dict[str, ast.stmt]:
    """Name -> the last top-level import, def, class or assignment that binds it (each
    statement keeps its source text, comments included, as `.text`)."""
    bound: dict[str, ast.stmt] = {}
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue  # not plain Python; a cell the script cannot use anyway
        for stmt in tree.body:
            stmt.text = _with_decorators(src, stmt)  # type: ignore[attr-defined]
            for name in _binds(stmt):
                bound[name] = stmt
    return bound


def _with_decorators(src: str, stmt: ast.stmt) -> str:
    first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    return "\n".join(src.splitlines()[first - 1:stmt.end_lineno])


def _binds(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def needed(name: str, bound: dict[str, ast.stmt]) -> list[ast.stmt]:
    """The statements `name` needs, itself included, transitively, in notebook order."""
    if name not in bound or not isinstance(bound[name], (ast.FunctionDef, ast.AsyncFunctionDef)):
        found = sorted(n for n, s in bound.items() if isinstance(s, ast.FunctionDef))
        raise ExportError(f"no function {name!r} defined at the top level of a code cell; "
                          f"the notebook defines: {', '.join(found) or 'none'}")
    order = list(dict.fromkeys(bound.values()))
    keep, todo = set(), [bound[name]]
    while todo:
        stmt = todo.pop()
        if id(stmt) in keep:
            continue
        keep.add(id(stmt))
        used = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        todo.extend(bound[u] for u in used if u in bound and id(bound[u]) not in keep)
    return [s for s in order if id(s) in keep]


def _argument(param: ast.arg, default: ast.expr | None) -> str:
    """The add_argument line for one parameter, typed by its default value."""
    if default is None:
        return f'    parser.add_argument("{param.arg}")'
    try:
        value = ast.literal_eval(default)
    except ValueError:
        value = ...
    flag = "--" + param.arg.replace("_", "-")
    if isinstance(value, bool):
        return (f'    parser.add_argument("{flag}", action=argparse.BooleanOptionalAction, '
                f"default={value!r})")
    if value is None or isinstance(value, (int, float, str)):
        kind = "str" if value is None else type(value).__name__
        return f'    parser.add_argument("{flag}", type={kind}, default={value!r})'
    raise ExportError(f"parameter {param.arg!r}: its default {ast.unparse(default)} is not a "
                      "number, a string, a bool or None, so the command line cannot give "
                      "it; make it one of those and build the object inside the function")


def main_block(fn: ast.FunctionDef, origin: str) -> str:
    """main(): the command line from fn's signature, then the process group torchrun describes."""
    args = fn.args
    if args.vararg or args.kwarg or args.posonlyargs or args.kwonlyargs:
        raise ExportError(f"{fn.name}(): use plain parameters (no *args, **kwargs, / or *) "
                          "so that each one becomes a command-line argument")
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    lines = [_argument(a, d) for a, d in zip(args.args, defaults)]
    call = ", ".join(f"{a.arg}=args.{a.arg}" for a in args.args)
    return MAIN.format(name=fn.name, origin=origin, arguments="\n".join(lines), call=call)


MAIN = '''

@record  # a worker's exception reaches torchrun's error summary, with its traceback
def main():
    """Run {name}() on this process's rank, as torchrun describes it in the environment."""
    parser = argparse.ArgumentParser(description="{name}() from {origin}, for torchrun")
{arguments}
    args = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit("RANK is not set: start this script with torchrun, e.g. "
                 "torchrun --standalone --nproc-per-node 2 " + sys.argv[0])
    rank = int(os.environ["RANK"])  # this process among all of them, 0 .. WORLD_SIZE - 1
    world_size = int(os.environ["WORLD_SIZE"])
    backend = pick_backend(int(os.environ["LOCAL_RANK"]))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" \\
            and os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
        sys.exit("--max-restarts with torchrun's shared store: a restarted worker may read "
                 "the dead workers' keys and hang or fail (lesson 14). Start torchrun with "
                 "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, e.g. TORCH_DISABLE_SHARE_RDZV_TCP_"
                 "STORE=1 torchrun ... " + sys.argv[0])
    # MASTER_ADDR and MASTER_PORT (also set by torchrun) say where the store is.
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        {name}({call})
    finally:
        gc.collect()  # a DDP model left in a reference cycle would outlive its group
        dist.destroy_process_group()


def pick_backend(local_rank):
    """NCCL on cuda:LOCAL_RANK when this node has a GPU for each of its processes, else
    gloo on the CPU (cuda:LOCAL_RANK would not exist), said in one line per node."""
    here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # processes on this node
    gpus = torch.cuda.device_count()
    if here <= gpus:
        torch.cuda.set_device(local_rank)  # one GPU per process
        return "nccl"
    if local_rank == 0:
        print(f"gloo on the CPU: {{gpus}} GPU(s) for {{here}} processes on this node", flush=True)
    return "gloo"


if __name__ == "__main__":
    main()
'''

NEEDED_BY_MAIN = ["import argparse", "import gc", "import os", "import sys", "import torch",
                  "import torch.distributed as dist",
                  "from torch.distributed.elastic.multiprocessing.errors import record"]


def export(notebook: str | Path, function: str) -> str:
    """The script's text: imports, the definitions `function` needs, and main()."""
    bound = top_level(code_cells(notebook))
    stmts = needed(function, bound)
    others = [s for s in stmts if not isinstance(s, (ast.Import, ast.ImportFrom))]
    used = {n.id for s in others for n in ast.walk(s) if isinstance(n, ast.Name)}
    imports = [_only(s, used) for s in stmts if isinstance(s, (ast.Import, ast.ImportFrom))]
    names = {n for s in imports for n in _binds(s)}
    lines = [line for line in NEEDED_BY_MAIN if line.split()[-1] not in names]
    lines += [ast.unparse(s) for s in imports]
    header = f'"""{function}() exported from {notebook} by python -m course_lib export."""\n\n'
    body = "\n".join(sorted(lines, key=lambda ln: (ln.startswith("from"), ln))) + "\n"
    for stmt in others:
        body += "\n\n" + stmt.text + "\n"  # type: ignore[attr-defined]
    return header + body + main_block(bound[function], str(notebook))


def _only(stmt: ast.Import | ast.ImportFrom, used: set[str]) -> ast.stmt:
    """The import with only the names the script uses (`from course_lib import launch,
    telemetry` -> `... import telemetry`: importing launch would start its forkserver)."""
    kept = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in used]
    if isinstance(stmt, ast.Import):
        return ast.Import(names=kept)
    return ast.ImportFrom(module=stmt.module, names=kept, level=stmt.level)


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib export: write the script, or say clearly why not."""
    parser = argparse.ArgumentParser(prog="python -m course_lib export",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="the .ipynb file that defines the function")
    parser.add_argument("--function", required=True, help="the function to export")
    parser.add_argument("-o", "--output", required=True, help="the script to write (.py)")
    args = parser.parse_args(argv)
    try:
        text = export(args.notebook, args.function)
    except (ExportError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    Path(args.output).write_text(text)
    print(f"wrote {args.output}: {args.function}() and what it needs; run it with "
          f"torchrun --standalone --nproc-per-node 2 {args.output} ...")
    return 0
