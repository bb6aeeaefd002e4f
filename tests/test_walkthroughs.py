"""The read-this-first walk-throughs (docs/walkthrough-*.md) name real code.

Each page names its hops as `path/to/file.py::name` (a function, class, method or constant,
dotted for a method: `launcher.py::_Launch.run`) or as a bare `path/to/file.py`. A rename
that leaves a page pointing at nothing fails here, naming the page and the reference.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("walkthrough-*.md"))
FLOWS = {"walkthrough-launch.md", "walkthrough-check.md", "walkthrough-xray.md"}
# `course_lib/x/y.py` or `course_lib/x/y.py::Name.attr`, inside backticks
REFERENCE = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)(?:::([\w.]+))?`")


def references(text: str) -> list[tuple[str, str]]:
    """(path, dotted name or "") for every code reference in a page."""
    return [(m.group(1), m.group(2) or "") for m in REFERENCE.finditer(text)]


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines: defs, classes and assigned names."""
    found: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found[node.name] = node
        elif isinstance(node, ast.Assign):
            found.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = node
    return found


def missing(root: Path, path: str, dotted: str) -> str | None:
    """Why the reference does not resolve, or None when it does."""
    file = root / path
    if not file.is_file():
        return f"{path}: no such file"
    scope: ast.AST = _tree(file)
    for part in dotted.split(".") if dotted else []:
        names = _names(getattr(scope, "body", []))
        if part not in names:
            return f"{path}::{dotted}: no {part!r} there"
        scope = names[part]
    return None


def test_every_flow_has_its_page() -> None:
    assert {p.name for p in PAGES} >= FLOWS


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_reference_names_code_that_exists(page: Path) -> None:
    refs = references(page.read_text())
    assert len(refs) >= 10, f"{page.name} names only {len(refs)} hops; name each hop's file"
    broken = [why for path, name in refs if (why := missing(ROOT, path, name))]
    assert not broken, f"{page.name} points at code that is gone:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_has_a_diagram(page: Path) -> None:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), flags=re.S)
    assert any(len(b.splitlines()) >= 10 for b in blocks), f"{page.name} has no diagram"


def test_contributing_points_to_every_page() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert [p.name for p in PAGES if f"docs/{p.name}" not in text] == []


def test_a_stale_reference_is_caught(tmp_path: Path) -> None:
    """The resolver fails a renamed file, function or method (a positive control)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/mod.py").write_text("X = 1\nclass A:\n    def run(self): ...\n"
                                         "def f(): ...\n")
    page = ("`pkg/mod.py::A.run` `pkg/mod.py::f` `pkg/mod.py::X` `pkg/mod.py` "
            "`pkg/mod.py::A.gone` `pkg/mod.py::g` `pkg/old.py::f`")
    results = [missing(tmp_path, path, name) for path, name in references(page)]
    assert results[:4] == [None] * 4
    assert all(results[4:]), results
