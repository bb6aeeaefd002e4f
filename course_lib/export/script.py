"""python -m course_lib export NOTEBOOK --function NAME -o SCRIPT: a function written in a
notebook becomes a script that torchrun runs, unchanged, on a machine with only torch.

The script holds the notebook's imports that the function needs, the function, and the
other top-level definitions it uses (functions, classes, constants), found by reading the
code, not by running it; what it uses of course_lib is copied in (carry.py). Its `main()`
reads RANK, LOCAL_RANK and WORLD_SIZE from the environment (torchrun sets them, with
MASTER_ADDR and MASTER_PORT), joins the process group by the course's rule
(devices.torchrun_backend: NCCL on cuda:LOCAL_RANK when the node has a GPU per process,
else gloo on the CPU, said in one line), calls the function with the command line's
arguments (one per parameter, typed by the default value), and leaves the group, also
when the function raised. `@record` sends a worker's traceback to torchrun's error
summary. Never imports torch itself.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import textwrap
from pathlib import Path

from course_lib.export.carry import PACKAGE, Carried, module_file
from course_lib.export.source import (
    ExportError,
    binds,
    code_cells,
    names_used,
    needed,
    only,
    top_level,
)


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
    backend = torchrun_backend()  # the course's rule: NCCL with a GPU per process, else gloo
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" \\
            and os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
        raise RuntimeError(  # raised, not sys.exit: @record quotes it in torchrun's summary
            "--max-restarts with torchrun's shared store: a restarted worker may read the "
            "dead workers' keys and hang or fail (lesson 14). Start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, e.g. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "torchrun ... " + sys.argv[0])
    # MASTER_ADDR and MASTER_PORT (also set by torchrun) say where the store is.
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        {name}({call})
    finally:
        gc.collect()  # a DDP model left in a reference cycle would outlive its group
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

NEEDED_BY_MAIN = ["import argparse", "import gc", "import os", "import sys", "import torch",
                  "import torch.distributed as dist",
                  "from torch.distributed.elastic.multiprocessing.errors import record"]


def export(notebook: str | Path, function: str, with_course: bool = False) -> str:
    """The script's text: imports, what `function` uses of course_lib (copied, unless
    `with_course`), the definitions `function` needs, and main()."""
    bound = top_level(code_cells(notebook))
    stmts = needed(function, bound)
    others = [s for s in stmts if not isinstance(s, (ast.Import, ast.ImportFrom))]
    used = set().union(*map(names_used, others))
    imports = [only(s, used) for s in stmts if isinstance(s, (ast.Import, ast.ImportFrom))]
    ours = [s for s in imports if (getattr(s, "module", None) or "").startswith("course_lib")
            or any(a.name.startswith("course_lib") for a in s.names)]
    imports = [s for s in imports if s not in ours]
    carried = Carried(function)
    if with_course:
        imports += [*ours, ast.parse("from course_lib.devices import torchrun_backend").body[0]]
    else:
        for stmt in ours:
            carried.add_import(stmt, others)
        carried.add("course_lib.devices", "torchrun_backend")
        _refuse_clashes(carried, imports, others)
    names = {n for s in imports for n in binds(s)}
    lines = [line for line in NEEDED_BY_MAIN if line.split()[-1] not in names]
    lines += dict.fromkeys(ast.unparse(s) for s in [*imports, *carried.imports])
    body = "\n".join(sorted(set(lines), key=lambda ln: (ln.startswith("from"), ln))) + "\n"
    if carried.stmts or carried.bindings:
        body += f"\n\n{COPIED}\n\n" + carried.text()
    body += f"\n\n# -- from {Path(notebook).name}\n"
    for stmt in others:
        body += "\n\n" + stmt.text + "\n"  # type: ignore[attr-defined]
    header = _header(notebook, function, sorted(set(lines)), carried, _object_collectives(body))
    return header + body + main_block(bound[function], str(notebook))


COPIED = ("# -- copied from course_lib by `python -m course_lib export`: the script never "
          "imports it")


# torch's collectives of Python objects that unpickle what they receive through numpy
# (torch/distributed/distributed_c10d.py, _tensor_to_object: `tensor.numpy().tobytes()`),
# although torch does not require numpy: without it they fail with "Numpy is not available".
OBJECT_COLLECTIVES = ("all_gather_object", "gather_object", "broadcast_object_list",
                      "scatter_object_list", "recv_object_list")


def _object_collectives(code: str) -> list[str]:
    """The object collectives that `code` calls (dist.all_gather_object(...), ...)."""
    names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(ast.parse(code))
             if isinstance(n, ast.Attribute | ast.Name)}
    return [name for name in OBJECT_COLLECTIVES if name in names]


def _header(notebook: str | Path, function: str, imports: list[str], carried: Carried,
            object_collectives: list[str]) -> str:
    """The script's docstring: where it comes from, how to run it, and what it needs."""
    tops = {line.split()[1].split(".")[0] for line in imports}
    needs = sorted(t for t in tops if t not in sys.stdlib_module_names)
    copied = ", ".join(str(module_file(m).relative_to(PACKAGE.parent))  # type: ignore[union-attr]
                       for m, stmts in carried.stmts.items() if stmts)
    lines = [f"{function}() exported from {notebook} by python -m course_lib export.", "",
             "Run it with torchrun on every node, e.g.",
             "    torchrun --standalone --nproc-per-node 2 THIS_FILE ARGS",
             f"It imports {', '.join(needs)} (and the standard library)."]
    if object_collectives and "numpy" not in needs:
        lines.append(f"It also needs numpy where it runs: torch's {object_collectives[0]} reads "
                     "what it receives through numpy (torch/distributed/distributed_c10d.py, "
                     "_tensor_to_object), though torch does not require numpy.")
    if copied:
        lines.append(f"What {function}() uses of course_lib is copied below, from {copied}.")
    if carried.bindings and any("course_lib import telemetry" in b for b in carried.bindings):
        lines.append("The course's telemetry is used where course_lib is installed; elsewhere "
                     "it records nothing.")
    wrapped = [line if line.startswith(" ") else textwrap.fill(line, 88) for line in lines]
    return '"""' + "\n".join(wrapped) + '\n"""\n\n'


def _refuse_clashes(carried: Carried, imports: list[ast.stmt], others: list[ast.stmt]) -> None:
    """Refuse a name that the notebook and the copied course code bind to different things
    (the notebook's own `capture`, or `random` assigned where checkpoints imports it)."""
    meanings: dict[str, set[str]] = {}
    for name, meaning in [*_targets(imports + carried.imports), *carried.names().items(),
                          *((n, "the notebook's") for s in others for n in binds(s))]:
        meanings.setdefault(name, set()).add(meaning)
    clashes = sorted(n for n, found in meanings.items() if len(found) > 1)
    if clashes:
        raise ExportError(f"{', '.join(clashes)}: the notebook and the course_lib code that the "
                          "script copies both define it; rename yours, or export with "
                          "--with-course")


def _targets(imports: list[ast.stmt]) -> list[tuple[str, str]]:
    """(name, what it is bound to) for each name these imports bind."""
    return [((a.asname or a.name).split(".")[0],
             a.name if isinstance(s, ast.Import) else f"{s.module}.{a.name}")
            for s in imports for a in s.names]  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    """python -m course_lib export: write the script, or say clearly why not."""
    parser = argparse.ArgumentParser(prog="python -m course_lib export",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebook", help="the .ipynb file that defines the function")
    parser.add_argument("--function", required=True, help="the function to export")
    parser.add_argument("-o", "--output", required=True, help="the script to write (.py)")
    parser.add_argument("--with-course", action="store_true",
                        help="keep the course_lib imports instead of copying what the "
                             "function uses (every node then needs the course installed)")
    args = parser.parse_args(argv)
    try:
        text = export(args.notebook, args.function, args.with_course)
    except (ExportError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    Path(args.output).write_text(text)
    print(f"wrote {args.output}: {args.function}() and what it needs; run it with "
          f"torchrun --standalone --nproc-per-node 2 {args.output} ...")
    return 0
