"""The package stands in layers: no module imports one that imports it back (directly or
through others) at run time, and the authoring tools never import torch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"

# Deliberate imports that point back up, each done inside a function on first use:
# the package's PEP 562 facade (course_lib/__init__.py), and Run.telemetry, which builds the
# learner's tables from what the ranks sent (course_lib/launching/run.py).
ALLOWED_UPWARD = {("course_lib", "*"), ("course_lib.launching.run", "course_lib.telemetry")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST, package: str, hints: bool = False) -> list[tuple[str, bool]]:
    """(imported module, inside a function?) for each import run outside TYPE_CHECKING
    (with `hints`, those inside it too)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if _type_checking_only(node) and not hints:
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.append((base, in_function))
            found.extend((f"{base}.{alias.name}", in_function) for alias in node.names
                         if f"{base}.{alias.name}" in MODULES)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def import_graph(hints: bool = False) -> dict[str, set[str]]:
    """Module -> the course_lib modules that importing it runs (with `hints`, also those it
    imports for type hints only)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for target, in_function in _imports(ast.parse(path.read_text()), package, hints):
            if not target.startswith("course_lib"):
                continue
            if in_function and ((name, "*") in ALLOWED_UPWARD
                                or (name, target) in ALLOWED_UPWARD):
                continue
            # importing a.b.c runs a and a.b first, except the packages `name` is inside:
            # those are importing it (or done) already
            parts = target.split(".")
            prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            edges.update(p for p in prefixes if p in MODULES and not name.startswith(f"{p}."))
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            connect(v)
    return found


def test_every_import_of_the_package_names_one_of_its_modules():
    """So that the graph below misses no edge (and a stale path after a move shows here)."""
    missing = [f"{name}: {target}" for name, path in MODULES.items()
               for target, _ in _imports(ast.parse(path.read_text()), name)
               if target.startswith("course_lib") and target not in MODULES]
    assert missing == []


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_no_circle_even_through_type_hints():
    """A plug-in names a protocol, not its host: telemetry's watchers write through
    telemetry/host.py's RecordHost (issue 27, N16), so not even type hints circle."""
    assert cycles(import_graph(hints=True)) == []


# What each part of the package may import (CONTRIBUTING.md, "How the pieces fit"): layers
# below it only. `__main__` reaches its commands through importlib, inside main().
MAY_IMPORT = {
    "protocol": set(), "collectors": set(), "wrappers": set(), "devices": set(),
    "words": set(),
    "launching": {"collectors", "network", "devices", "words"},
    "telemetry": {"collectors", "wrappers", "devices"},
    "plots": {"telemetry"},
    "teach": {"protocol", "wrappers", "launching", "telemetry", "plots", "network", "devices",
              "words"},
    "checks": {"protocol", "wrappers", "launching", "telemetry", "teach", "xray", "devices",
               "words", "board"},
    "authoring": {"protocol", "pitfalls"},
    "network": set(), "export": set(),
    "doctor": {"launching", "network"},
    "xray": {"collectors", "launching", "pitfalls", "words", "devices"},
    "pitfalls": set(),
    "board": set(),  # the workshop board: its client (stdlib only) is what checks import
    "__main__": set(),
}


def part(module: str) -> str:
    """course_lib.telemetry.chrome -> "telemetry"; the package itself -> ""."""
    return module.split(".")[1] if "." in module else ""


def test_each_part_imports_only_the_layers_below_it():
    found = {(part(m), part(t)) for m, targets in import_graph().items() for t in targets
             if part(t) and part(t) != part(m)}
    assert {p for p, _ in found} <= set(MAY_IMPORT), "a new part: give it a row in MAY_IMPORT"
    assert sorted((p, t) for p, t in found if t not in MAY_IMPORT[p]) == []


def test_the_cycle_finder_finds_a_circle():
    """A positive control: a circle through a function-local import, as merged.py and
    chrome.py once had, is found; a TYPE_CHECKING-only import is not an edge."""
    merged = ast.parse("from course_lib.telemetry.table import Table\n"
                       "def to_trace():\n    from course_lib.telemetry.chrome_like import save\n")
    hints = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from course_lib.telemetry.merged_like import Telemetry\n")
    assert _imports(merged, "course_lib.telemetry") == [("course_lib.telemetry.table", False),
                                                        ("course_lib.telemetry.chrome_like", True)]
    assert [t for t, _ in _imports(hints, "course_lib.telemetry")] == ["typing"]
    assert [t for t, _ in _imports(hints, "course_lib.telemetry", hints=True)] == [
        "typing", "course_lib.telemetry.merged_like"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


TORCH_FREE = ["course_lib", "course_lib.protocol", "course_lib.authoring.gate",
              "course_lib.authoring.coverage", "course_lib.authoring.exercises",
              "course_lib.authoring.stubs", "course_lib.doctor", "course_lib.checks",
              "course_lib.network", "course_lib.export", "course_lib.pitfalls",
              "course_lib.words", "course_lib.board.client"]


def imported(*args: str) -> set[str]:
    """Every module `python -X importtime ARGS` imports, read from its import-time report."""
    done = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|") for line in done.stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2]
    return {row[2].strip() for row in rows}


def test_the_authoring_tools_do_not_import_torch():
    code = "\n".join(f"import {m}" for m in TORCH_FREE)
    assert "torch" not in imported("-c", code)


def test_the_gate_command_line_does_not_import_torch():
    assert "torch" not in imported("-m", "course_lib", "gate", "--help")


def test_the_import_report_shows_torch_when_it_is_imported():
    """Positive control for the two tests above (a cheap module that imports torch)."""
    assert "torch" in imported("-c", "import course_lib.wrappers")


@pytest.mark.parametrize("name", ["launch", "DistributedError", "Run", "observe", "rank_device"])
def test_the_lazy_package_still_exports_the_learners_names(name):
    import course_lib

    assert name in course_lib.__all__ and callable(getattr(course_lib, name))


def test_every_public_name_has_one_home():
    """__all__ is derived from _HOMES, and each home really defines its name."""
    import importlib

    import course_lib

    assert course_lib.__all__ == list(course_lib._HOMES)
    for name, home in course_lib._HOMES.items():
        assert hasattr(importlib.import_module(home), name), f"{home} has no {name}"
