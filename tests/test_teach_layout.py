"""teach/'s rule (CONTRIBUTING.md, "Where a figure goes"; issue 27, N21): a module that may
run on the ranks imports the plotting stack only inside its drawing functions, so only a
pictures-only module, named *_views.py and imported by no module of the package, imports it
at the top."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEACH = ROOT / "course_lib" / "teach"
DISPLAY = ("matplotlib", "ipywidgets", "IPython", "course_lib.plots")


def top_level_imports(source: str) -> list[str]:
    """The modules a source imports outside any function or class."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def draws_at_import(source: str) -> bool:
    """Whether importing this source imports the plotting or display stack."""
    return any(m == d or m.startswith(f"{d}.") for m in top_level_imports(source)
               for d in DISPLAY)


def test_only_views_modules_import_the_plotting_stack_at_the_top():
    eager = sorted(p.relative_to(ROOT).as_posix() for p in TEACH.rglob("*.py")
                   if draws_at_import(p.read_text()) and not p.stem.endswith("_views"))
    assert eager == [], (f"{eager} import matplotlib, ipywidgets or plots at the top: move "
                         "those imports into the drawing functions (the ranks may import the "
                         "module), or, for pictures only, name it <idea>_views.py")


def test_no_module_of_the_package_imports_a_views_module():
    importers = []
    for path in (ROOT / "course_lib").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [f"{n.module}.{a.name}" for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        if any(name.split(".")[-1].endswith("_views") for name in names):
            importers.append(path.relative_to(ROOT).as_posix())
    assert importers == [], f"{importers} import a pictures-only *_views module"


def test_the_scanner_sees_a_top_level_import_and_not_a_local_one():
    """Positive control for the two tests above."""
    assert draws_at_import("from course_lib.plots.style import new_figure\n")
    assert draws_at_import("import matplotlib.pyplot as plt\n")
    assert not draws_at_import("def plot():\n    from course_lib.plots import charts\n")
    assert not draws_at_import("import torch\nfrom course_lib.plotsy import x\n")
