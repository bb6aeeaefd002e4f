"""The pitfall cell metadata schema: read `metadata.course` of each cell (the shape is in
`course_lib.protocol`) and say what is wrong with it, so the gate and the coverage table
read lessons the same way."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from course_lib.pitfalls import id_problem
from course_lib.protocol import (
    ERROR,
    MATCH,
    OBSERVED,
    PITFALL,
    RAISES,
    ROLE,
    ROLES,
    SYMPTOM,
    course_meta,
    tags,
)


@dataclass(frozen=True)
class Symptom:
    """What a cell shows: an error (`kind` "error", `name` its class, `match` a fragment of
    its message, `also` the fragments older torch versions show instead) or an observation
    (`kind` "observed", `name` the observe() name)."""

    kind: str
    name: str
    match: str = ""
    also: tuple[str, ...] = ()

    def in_message(self, message: str) -> bool:
        """Whether an error message shows this symptom (any torch version's wording)."""
        return any(fragment in message for fragment in (self.match, *self.also))

    def __str__(self) -> str:
        if self.kind == ERROR:
            return f"{self.name}({self.match!r})"
        return f"observed {self.name}"


@dataclass(frozen=True)
class PitfallCell:
    """A code cell that declares a pitfall; `number` counts cells from 1, as a reader does."""

    number: int
    pitfall: str
    role: str
    symptom: Symptom


def read_cells(nb: Any) -> tuple[list[PitfallCell], list[str]]:
    """The notebook's pitfall cells, and every problem with their metadata and pairing."""
    cells: list[PitfallCell] = []
    problems: list[str] = []
    for number, cell in enumerate(nb.cells, start=1):
        meta = course_meta(cell)
        if PITFALL not in meta and ROLE not in meta and SYMPTOM not in meta:
            continue
        found = _read_cell(number, cell, meta)
        if isinstance(found, PitfallCell):
            cells.append(found)
        else:
            problems.extend(f"cell {number}: {p}" for p in found)
    return cells, problems + pairing_problems(cells)


def _read_cell(number: int, cell: Any, meta: dict) -> PitfallCell | list[str]:
    problems: list[str] = []
    if cell.get("cell_type") != "code":
        problems.append("pitfall metadata on a non-code cell")
    if (why := id_problem(meta.get(PITFALL))) is not None:
        problems.append(why)
    role = meta.get(ROLE)
    if role not in ROLES:
        problems.append(f"role {role!r} is not one of {', '.join(ROLES)}")
    symptom = _read_symptom(meta.get(SYMPTOM))
    if isinstance(symptom, str):
        problems.append(symptom)
    if problems or isinstance(symptom, str):
        return problems
    problems = _tag_problems(str(role), symptom, tags(cell))
    return problems or PitfallCell(number, meta[PITFALL], str(role), symptom)


def _read_symptom(raw: Any) -> Symptom | str:
    """The declared symptom, or why it is malformed."""
    keys = set(raw) if isinstance(raw, dict) else set()
    fragments = raw.get(MATCH) if isinstance(raw, dict) else None
    if isinstance(fragments, str):
        fragments = [fragments]
    if (keys == {ERROR, MATCH} and _identifier(raw[ERROR]) and isinstance(fragments, list)
            and fragments and all(_nonempty(f) for f in fragments)):
        return Symptom(ERROR, raw[ERROR], fragments[0], tuple(fragments[1:]))
    if keys == {OBSERVED} and _identifier(raw[OBSERVED]):
        return Symptom(OBSERVED, raw[OBSERVED])
    return (f"symptom {raw!r} must be {{'error': 'ClassName', 'match': 'fragment'}} (or a "
            "list of fragments) or {'observed': 'name'}")


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _identifier(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier()


def _tag_problems(role: str, symptom: Symptom, tags: list[str]) -> list[str]:
    raises = RAISES in tags
    if symptom.kind == ERROR and role != "fixed" and not raises:
        return [f"a {role} cell whose symptom is an error must be tagged {RAISES!r}"]
    if role == "fixed" and raises:
        return [f"a fixed cell must not be tagged {RAISES!r}: it would hide a real error"]
    return []


def pairing_problems(cells: list[PitfallCell]) -> list[str]:
    """Every broken cell needs a fixed cell with the same pitfall and symptom, and vice versa."""
    roles: dict[tuple[str, str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        roles[(c.pitfall, c.symptom.kind, c.symptom.name)][c.role].append(c.number)
    problems = []
    for (pid, kind, name), by_role in roles.items():
        for have, need in (("broken", "fixed"), ("fixed", "broken")):
            if by_role[have] and not by_role[need]:
                numbers = ", ".join(map(str, by_role[have]))
                problems.append(f"cell {numbers}: {have} {pid} ({kind} {name}) has no {need} "
                                f"partner with the same pitfall and symptom")
    return problems
