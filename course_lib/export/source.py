"""Python source read as top-level statements: which statement binds a name, and which
statements a name needs, found by reading the code, never by running it. A notebook's code
cells and a course_lib module are read the same way."""

from __future__ import annotations

import ast
import json
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
            for name in binds(stmt):
                bound[name] = stmt
    return bound


def _with_decorators(src: str, stmt: ast.stmt) -> str:
    stmt.first = min([stmt.lineno,  # type: ignore[attr-defined]
                      *(d.lineno for d in getattr(stmt, "decorator_list", []))])
    return "\n".join(src.splitlines()[stmt.first - 1:stmt.end_lineno])  # type: ignore[attr-defined]


def binds(stmt: ast.stmt) -> list[str]:
    """The names a top-level statement binds."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names if a.name != "*"]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def names_used(stmt: ast.AST) -> set[str]:
    """Every name the statement reads or writes (its annotations included)."""
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def closure(names: list[str], bound: dict[str, ast.stmt]) -> list[ast.stmt]:
    """The statements that bind `names` and everything they use, transitively, in source
    order. `.used` on a statement, when set, replaces what reading it finds."""
    order = list(dict.fromkeys(bound.values()))
    keep: set[int] = set()
    todo = [bound[n] for n in names]
    while todo:
        stmt = todo.pop()
        if id(stmt) in keep:
            continue
        keep.add(id(stmt))
        used = getattr(stmt, "used", None) or names_used(stmt)
        todo.extend(bound[u] for u in used if u in bound and id(bound[u]) not in keep)
    return [s for s in order if id(s) in keep]


def needed(name: str, bound: dict[str, ast.stmt]) -> list[ast.stmt]:
    """The statements the notebook's function `name` needs, itself included."""
    if name not in bound or not isinstance(bound[name], (ast.FunctionDef, ast.AsyncFunctionDef)):
        found = sorted(n for n, s in bound.items() if isinstance(s, ast.FunctionDef))
        raise ExportError(f"no function {name!r} defined at the top level of a code cell; "
                          f"the notebook defines: {', '.join(found) or 'none'}")
    return closure([name], bound)


def only(stmt: ast.Import | ast.ImportFrom, used: set[str]) -> ast.Import | ast.ImportFrom:
    """The import with only the names the script uses (`from course_lib import launch,
    telemetry` -> `... import telemetry`: importing launch would start its forkserver)."""
    kept = [a for a in stmt.names if (a.asname or a.name).split(".")[0] in used]
    if isinstance(stmt, ast.Import):
        return ast.Import(names=kept)
    return ast.ImportFrom(module=stmt.module, names=kept, level=stmt.level)
