"""What a notebook function uses of course_lib, copied into the script so that it needs only
torch: the definitions read from course_lib's own source files (never imported here), so
the script and the library cannot drift.

- `rank_device` and the backend rule come from course_lib/devices.py, exactly as written;
- the checkpoint helpers (course_lib/teach/checkpoints.py) and `unwrap`, with their
  annotations as strings, as `from __future__ import annotations` keeps them in the library;
- a module used by name (`ckpt.capture(...)`) becomes a namespace of what the function uses;
- the telemetry is optional: the course's recorder where course_lib is installed, else a
  stand-in that records nothing (CARRIED lists what can be copied; anything else needs
  `--with-course`).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from course_lib.export.source import ExportError, binds, closure, names_used, only, top_level

PACKAGE = Path(__file__).resolve().parents[1]
# The modules a script may copy definitions from: torch and the standard library only.
CARRIED = ("course_lib.devices", "course_lib.wrappers", "course_lib.teach.checkpoints")
TELEMETRY = "course_lib.telemetry"
TELEMETRY_NAMES = {"Recorder", "ENV_DIR"}  # what the stand-in below provides
WITH_COURSE = ("export with --with-course to keep the course_lib imports (every node then "
               "needs the course installed)")
STAND_IN = '''try:
    from course_lib import telemetry{as_alias}  # the course's recorder, where it is installed
except ImportError:  # not on this cluster: {function}() runs the same and records nothing

    class {alias}:  # noqa: N801 - stands in for course_lib.telemetry
        ENV_DIR = "COURSE_TELEMETRY_DIR"

        class Recorder:
            """course_lib.telemetry.Recorder's calls, recording nothing."""

            def __init__(self, *args, **kwargs):
                if os.environ.get("RANK", "0") == "0":
                    print("course_lib is not installed here: telemetry records nothing",
                          flush=True)

            def step(self, step):
                return contextlib.nullcontext()

            def span(self, name):
                return contextlib.nullcontext()

            def watch_sampler(self, sampler):
                return sampler

            def __getattr__(self, name):  # scalar, gradients, watch_ddp, save...: nothing
                return lambda *args, **kwargs: None'''


def module_file(module: str) -> Path | None:
    """course_lib.a.b -> its source file (a module or a package's __init__.py), or None."""
    base = PACKAGE.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@functools.cache
def module_bound(module: str) -> dict[str, ast.stmt]:
    """The module's top-level bindings. Under `from __future__ import annotations` each
    statement's annotations become strings in its copy (what that import makes them at run
    time), so the copy runs without it and needs no import for its annotations alone."""
    path = module_file(module)
    if path is None:
        raise ExportError(f"{module} is not a module of course_lib")
    bound = top_level([path.read_text()])
    if any(isinstance(s, ast.ImportFrom) and s.module == "__future__" for s in bound.values()):
        for stmt in set(bound.values()):
            if not isinstance(stmt, ast.Import | ast.ImportFrom):
                _quote_annotations(stmt)
    return bound


def _quote_annotations(stmt: ast.stmt) -> None:
    """Put each annotation of `stmt` in quotes, in its text (comments and layout kept) and
    in its tree (so that `.used` no longer counts the names only annotations use)."""
    found = _annotations(stmt)
    lines = [line.encode() for line in stmt.text.split("\n")]  # type: ignore[attr-defined]
    first = stmt.first  # type: ignore[attr-defined]
    for node in sorted(found, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        source = ast.unparse(node)
        quoted = (f'"{source}"' if '"' not in source else repr(source)).encode()
        top, bottom = node.lineno - first, node.end_lineno - first  # type: ignore[operator]
        lines[top:bottom + 1] = [lines[top][:node.col_offset] + quoted
                                 + lines[bottom][node.end_col_offset:]]
    stmt.text = b"\n".join(lines).decode()  # type: ignore[attr-defined]
    quoted_names = {id(n) for a in found for n in ast.walk(a)}
    stmt.used = {n.id for n in ast.walk(stmt)  # type: ignore[attr-defined]
                 if isinstance(n, ast.Name) and id(n) not in quoted_names}


def _annotations(stmt: ast.stmt) -> list[ast.expr]:
    """The annotation expressions in `stmt`: parameters', returns', variables'."""
    found: list[ast.expr] = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            found.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            found.append(node.returns)
    return found


def home(module: str, name: str) -> tuple[str, str]:
    """Where `from module import name` finds its definition, re-exports followed."""
    if module == "course_lib":  # the package's facade: _HOMES says where each name lives
        homes = ast.literal_eval(module_bound("course_lib")["_HOMES"].value)  # type: ignore[attr-defined]
        if name not in homes:
            raise ExportError(f"course_lib has no {name!r}")
        module = homes[name]
    stmt = module_bound(module).get(name)
    if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("course_lib"):
        original = next(a.name for a in stmt.names if (a.asname or a.name) == name)
        return home(stmt.module, original)  # type: ignore[arg-type]
    if stmt is None:
        raise ExportError(f"{module} defines no {name!r}")
    return module, name


class Carried:
    """The course_lib code a script copies: statements per module in source order, the
    other imports they need, and the lines that give the notebook's names to them."""

    def __init__(self, function: str) -> None:
        self.function = function
        self.stmts: dict[str, list[ast.stmt]] = {}
        self.imports: list[ast.stmt] = []
        self.bindings: list[str] = []  # `ckpt = SimpleNamespace(...)`, an alias, a stand-in

    def add_import(self, stmt: ast.Import | ast.ImportFrom, user: list[ast.stmt]) -> None:
        """Carry what a notebook import from course_lib gives the statements in `user`."""
        if isinstance(stmt, ast.Import) or stmt.level:
            raise ExportError(f"{ast.unparse(stmt)}: use `from course_lib... import name`, "
                              f"or {WITH_COURSE}")
        for alias in stmt.names:
            local = alias.asname or alias.name
            if module_file(f"{stmt.module}.{alias.name}"):
                self.add_module(f"{stmt.module}.{alias.name}", local, _attributes(local, user))
            else:
                self.add(*home(stmt.module, alias.name), local)  # type: ignore[arg-type]

    def add_module(self, module: str, local: str, attributes: set[str]) -> None:
        """`local.attr` for each attr: a namespace of the copied definitions, or the
        telemetry's stand-in."""
        if module == TELEMETRY and attributes <= TELEMETRY_NAMES:
            self.imports += [ast.parse("import contextlib").body[0],
                             ast.parse("import os").body[0]]
            as_alias = "" if local == "telemetry" else f" as {local}"
            self.bindings.append(STAND_IN.format(alias=local, as_alias=as_alias,
                                                 function=self.function))
            return
        pairs = [(name, self.add(*home(module, name))) for name in sorted(attributes)]
        self.imports.append(ast.parse("from types import SimpleNamespace").body[0])
        fields = ", ".join(f"{name}={value}" for name, value in pairs)
        self.bindings.append(f"{local} = SimpleNamespace({fields})  # {module}")

    def add(self, module: str, name: str, local: str | None = None) -> str:
        """Copy `name`'s definition from `module` with what it needs; returns its name."""
        if module not in CARRIED:
            raise ExportError(f"{self.function}() uses {name} from {module}, which a script "
                              f"cannot carry: {WITH_COURSE}")
        needs = closure([name], module_bound(module))
        used = set().union(*(_used(s) for s in needs if not _is_import(s)))
        have = self.stmts.setdefault(module, [])
        for stmt in needs:
            if not _is_import(stmt):
                if all(stmt is not s for s in have):
                    have.append(stmt)
            elif (getattr(stmt, "module", None) or "").startswith("course_lib"):
                for alias in only(stmt, used).names:  # type: ignore[arg-type]
                    self.add(*home(stmt.module, alias.name), alias.asname)  # type: ignore[attr-defined]
            elif getattr(stmt, "module", None) != "__future__":
                self.imports.append(only(stmt, used))  # type: ignore[arg-type]
        have.sort(key=lambda s: s.lineno)
        if local and local != name:
            self.bindings.append(f"{local} = {name}")
        return name

    def text(self) -> str:
        """The copied definitions, module by module, then the notebook's names for them."""
        parts = [f"# {module_file(m).relative_to(PACKAGE.parent)}\n"  # type: ignore[union-attr]
                 + _joined(stmts) for m, stmts in self.stmts.items() if stmts]
        return "\n\n\n".join(parts + self.bindings) + "\n"

    def names(self) -> dict[str, str]:
        """Each name the copied code binds -> where it comes from (to find clashes)."""
        return {n: f"{m}.{n}" for m, stmts in self.stmts.items() for s in stmts
                for n in binds(s)}


def _joined(stmts: list[ast.stmt]) -> str:
    """Statements' texts, two blank lines around a def or class, none between constants."""
    text = stmts[0].text  # type: ignore[attr-defined]
    for before, stmt in zip(stmts, stmts[1:]):
        plain = not any(isinstance(s, ast.FunctionDef | ast.ClassDef) for s in (before, stmt))
        text += ("\n" if plain else "\n\n\n") + stmt.text  # type: ignore[attr-defined]
    return text


def _used(stmt: ast.stmt) -> set[str]:
    return getattr(stmt, "used", None) or names_used(stmt)


def _is_import(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Import | ast.ImportFrom)


def _attributes(local: str, user: list[ast.stmt]) -> set[str]:
    """The attributes read from the name `local` in these statements (`ckpt.capture`)."""
    nodes = [n for s in user for n in ast.walk(s)]
    attrs = [n.attr for n in nodes if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Name) and n.value.id == local]
    if len(attrs) != sum(isinstance(n, ast.Name) and n.id == local for n in nodes):
        raise ExportError(f"{local} is used as a module object, not only as {local}.name: "
                          f"{WITH_COURSE}")
    return set(attrs)
