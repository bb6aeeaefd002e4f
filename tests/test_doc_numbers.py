"""Every measured figure in the pages learners and instructors read comes from a run. A time,
a size, a ratio or a percentage in README.md, the pre-workshop email or the instructor guide
must stand in a block that a command writes from the run that measured it, with its date and
load (tests/test_run_facts.py and tests/test_run_times.py compare those blocks with
docs/run_facts.json and docs/run_times.json), or be one of the settings, defaults, targets,
requirements and quotes listed below, each with why it is no measurement. A figure typed
into the prose fails here: put it in a generated block, or remove it.

Not read: fenced code blocks (commands, and outputs quoted as printed, with their date) and
inline code (`timeout=3` is code)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = re.compile(r"<!-- ([\w:-]+):start -->.*?<!-- \1:end -->", re.DOTALL)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
UNIT = r"(?:ms|s|sec|seconds?|min|minutes?|h|hours?|kB|KB|MB|GB|MiB|GiB|%|x|CPU-s)"
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?" + UNIT + r"(?!\w)")

# page -> {a phrase holding a figure that is not a measurement: why}
NOT_MEASURED = {
    "README.md": {
        "a line at least every 20 s": "scripts/setup's default SETUP_PROGRESS_EVERY",
        '"4x on 8 GPUs"': "the title of a case file (a colleague's report)",
        "rather than 30 minutes": "PyTorch's default process-group timeout",
        "(60 s by default)": "the launcher's default timeout",
        "(60 s by default in PyTorch 2.13)": "the rendezvous' default read timeout",
        "join timeout (600 s)": "the rendezvous' default join timeout",
        "target: at most 2x": "the x-ray's target",
        "a median under 10 s on 2 cores": "the x-ray's target per case script",
        "in at most 0.15 s at 2 ranks and 0.35 s at 4": "launch targets",
        "on ready ranks at most 0.12 s at 4 ranks": "launch target (issue 38)",
        "on ready ranks at most 0.03 s at 4 ranks": "launch target (issue 38)",
        "on ready ranks at most 0.25 s": "GPU launch target (issue 38)",
        "10x faster than `mp.spawn` and 5x faster than": "launch targets",
        "at 4 ranks in at most 0.10 s": "launch target",
        "in at most 3 s right after": "launch target",
        "and 1.5 s when imported 5 s before": "launch target, and the benchmark's setting",
        "at most 150 MB": "memory target",
        "within its timeout + 3 s": "fault target",
        "at most 10% to a training step": "telemetry target",
    },
    "docs/pre-workshop-email.md": {
        "about 2 GB of free": "a requirement, rounded up from the .venv size above",
    },
    "docs/instructors.md": {
        "lesson 00's after 3 s, 03's after its 2 s process-group timeout, 05's\n  after 3 s":
            "timeouts the lessons' cells set",
        "ends at the default 60 s timeout": "the launcher's default timeout",
        "PyTorch's default 30 minutes (gloo)": "PyTorch's default process-group timeout",
        '"What a hang looks like" waits 3 s': "the timeout lesson 00's cell sets",
        "after the 2 s process-group timeout": "the timeout lesson 03's cell sets",
        "(a 1 MB first\n  bucket)": "DDP's default first bucket size",
        "hangs for the 3 s process-group timeout": "the timeout lesson 05's cell sets",
        "(process-group timeouts of 2-4 s set in the": "timeouts lesson 10's cells set",
        "defaults are 60 s and 600 s": "the rendezvous' default timeouts",
        "### Half day (3.5 hours)": "a suggested schedule, not a measurement",
        "### Two days (7 hours each": "a suggested schedule, not a measurement",
    },
}
PAGES = list(NOT_MEASURED)


def prose(text: str) -> str:
    """The page without generated blocks and code, each replaced by spaces (so positions
    and the lines around a figure stay as they are)."""
    for pattern in (GENERATED, CODE):
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return text


def typed_figures(page: str, text: str) -> list[str]:
    """The figures in the prose outside every listed phrase, each with its line."""
    allowed = [range(m.start(), m.end()) for phrase in NOT_MEASURED.get(page, {})
               for m in re.finditer(re.escape(phrase), text)]
    lines = text.splitlines()
    found = []
    for m in FIGURE.finditer(prose(text)):
        if not any(m.start() in span and m.end() - 1 in span for span in allowed):
            line = text.count("\n", 0, m.start())
            found.append(f"{page}:{line + 1}: {m.group(0)!r} in {lines[line].strip()!r}")
    return found


@pytest.mark.parametrize("page", PAGES)
def test_no_figure_is_typed_into_the_prose(page):
    found = typed_figures(page, (ROOT / page).read_text())
    assert found == [], ("figures not written by the run that measured them: move each into "
                         "a generated block, or remove it (or, for a setting, default, target "
                         "or requirement, list its phrase in NOT_MEASURED with why):\n"
                         + "\n".join(found))


@pytest.mark.parametrize("page", PAGES)
def test_every_listed_phrase_is_still_on_its_page(page):
    text = (ROOT / page).read_text()
    gone = [phrase for phrase in NOT_MEASURED[page] if phrase not in text]
    assert gone == [], f"{page}: no longer has {gone}: remove them from NOT_MEASURED"


def test_a_typed_figure_is_found_and_generated_code_and_listed_ones_are_not():
    text = ("The doctor takes 8 s here. `timeout=3 s` is code.\n```\n12.5 s\n```\n"
            "<!-- x:start -->\n40 min 00 s\n<!-- x:end -->\nIt ends at (60 s by default) and "
            "is 24x faster, 1.2 GB, 18.6%.\n")
    found = typed_figures("README.md", text)
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in found] == [
        "'8 s'", "'24x'", "'1.2 GB'", "'18.6%'"]
    assert found[0].startswith("README.md:1: ") and found[1].startswith("README.md:8: ")
