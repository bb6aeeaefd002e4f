"""Links a learner clicks in JupyterLab (opened at the repository root): every lesson links
its exercise, and every relative link in a notebook or the README points at a real file."""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _markdown(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def _relative_targets(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_links_its_exercise(lesson):
    assert f"](../exercises/{lesson.name})" in _markdown(lesson)


@pytest.mark.parametrize("page", [*LESSONS, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_point_at_files(page):
    text = page.read_text() if page.suffix == ".md" else _markdown(page)
    missing = [t for t in _relative_targets(text) if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"
