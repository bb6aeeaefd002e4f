"""Readable names for hint kinds, for the instructor. A kind that names where a check raised
its hint ("lesson00:_judge_summary+7": module under course_lib.checks, function, line offset)
reads as that hint's template, taken from the check's source on the hub
("with {n} ranks, rank {rank} reported rank={got_rank!r}: ask dist.get_rank()."): the
placeholders stay as written, so no learner's value is shown. Reads the source with `ast`;
never imports a check (that would import torch into the service)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[1] / "checks"
SITE = re.compile(r"(?P<module>\w+(?:\.\w+)*):(?P<function>\w+(?:\.\w+)*)\+(?P<offset>\d+)")
FIXED = {
    "pass": "passed",
    "not-callable": "passed the result of calling the function, not the function",
    "ranks-timeout": "did not finish in time (a rank waiting in a collective)",
    "ranks-exception": "raised an error on a rank",
    "ranks-exit": "a rank exited",
    "ranks-signal": "a rank was killed by a signal",
    "ranks-stopped": "a rank was stopped",
}
LABEL_CHARS = 160


def label(kind: str) -> str:
    """The hint's template for a raise-site kind, a fixed phrase for the others, else the
    kind itself (a check's own named kind, or a source this hub does not have)."""
    if kind in FIXED:
        return FIXED[kind]
    site = SITE.fullmatch(kind)
    text = _template(site["module"], site["function"], int(site["offset"])) if site else None
    if not text:
        return kind
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."


@functools.lru_cache(maxsize=256)
def _template(module: str, function: str, offset: int) -> str | None:
    """The first argument of the `Rejected(...)` call at `offset` lines into `function`."""
    tree = _tree(module)
    node = _function(tree, function.split(".")) if tree else None
    if node is None:
        return None
    line = min([node.lineno] + [d.lineno for d in node.decorator_list]) + offset
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and call.lineno == line and call.args
                and isinstance(call.func, ast.Name) and call.func.id == "Rejected"):
            return _text(call.args[0])
    return None


@functools.lru_cache(maxsize=64)
def _tree(module: str) -> ast.Module | None:
    base = CHECKS.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text())
    return None


Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _function(tree: ast.AST, names: list[str]) -> Definition | None:
    """The (possibly nested) function or class `names` lead to."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, Definition) and child.name == names[0]:
            return child if len(names) == 1 else _function(child, names[1:])
    return None


def _text(node: ast.expr) -> str:
    """An f-string as its template ("with {n} ranks ..."); any other expression as written."""
    if isinstance(node, ast.JoinedStr):
        return "".join(_field(part) if isinstance(part, ast.FormattedValue) else
                       str(getattr(part, "value", "")) for part in node.values)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node)


def _field(part: ast.FormattedValue) -> str:
    """One {placeholder} of an f-string, as written ({got!r}, {want:g})."""
    conversion = f"!{chr(part.conversion)}" if part.conversion != -1 else ""
    spec = f":{_text(part.format_spec)}" if part.format_spec else ""
    return "{" + ast.unparse(part.value) + conversion + spec + "}"
