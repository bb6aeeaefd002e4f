"""scripts/setup shows that it moves while pip works: a line per step, a line per big
download with its size, and in a log (CI) a line at least every SETUP_PROGRESS_EVERY seconds
(20 by default, so at least every 30 s), with pip's noise left out and pip's exit status
deciding. Run against a stand-in pip that prints what pip 26 prints and sleeps between
lines, with time scaled down (a line every 2 s, silences of 6 s): nothing is installed."""

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVERY = 2.0  # scaled down from 20 s
SILENCE = 6.0  # pip quiet for this long: without progress lines, a gap of 6 s

# What pip 26 prints for `pip install --progress-bar raw torch` (lines copied from a real
# run here, sizes made up), with silences where pip downloads, unpacks and installs.
FAKE_PIP = textwrap.dedent(f"""\
    import sys, time
    say = lambda line: print(line, flush=True)
    args = sys.argv[1:]
    pause = {SILENCE} if any(a.startswith("torch") for a in args) else 0  # only torch is slow
    say("Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple")
    say("WARNING: Location 'file:///opt/pypi-more/simple/torch/' is ignored: it is neither "
        "a file nor a directory.")
    say("Collecting torch==2.13.0")
    say("  Downloading torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl (191.8 MB)")
    for done in range(0, 191_794_682, 60_000_000):
        say(f"Progress {{done}} of 191794682")
        time.sleep(pause / 2)
    say("Progress 191794682 of 191794682")
    say("  Downloading filelock-3.20.0-py3-none-any.whl (16 kB)")
    say("Installing collected packages: filelock, torch")
    time.sleep(pause)
    if "-e" in args:
        print("  .../setuptools/command/editable_wheel.py:354: BuildBackendWarning: "
              "Editable installation.", file=sys.stderr, flush=True)
        for line in ["!!", "", "*" * 40, "Please be careful with folders", "*" * 40, "", "!!",
                     '  with strategy, WheelFile(wheel_path, "w") as wheel_obj:']:
            print("  " + line, file=sys.stderr, flush=True)
    if "broken" in args:
        print("ERROR: No matching distribution found for broken", file=sys.stderr, flush=True)
        sys.exit(1)
    say("Successfully installed filelock-3.20.0 torch-2.13.0+cpu")
""")


def timed_lines(command: list[str], cwd: Path, env: dict) -> tuple[int, list[tuple[float, str]]]:
    """Run the command; each line of its output with the time it arrived."""
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stdout]
    return proc.wait(), lines


def longest_gap(lines: list[tuple[float, str]]) -> float:
    times = [0.0] + [t for t, _ in lines]
    return max(b - a for a, b in zip(times, times[1:]))


@pytest.fixture
def fake_course(tmp_path):
    """A copy of scripts/setup beside a .venv whose python runs the stand-in pip for
    `-m pip`, succeeds for `-c "import ..."` and is the real Python otherwise."""
    (tmp_path / "scripts").mkdir()
    for name in ("setup", "pip_progress.py"):
        shutil.copy(ROOT / "scripts" / name, tmp_path / "scripts" / name)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$1" = -m ] && [ "$2" = pip ]; then
            shift 2; exec {sys.executable} {tmp_path}/fake_pip.py "$@"
        fi
        if [ "$1" = -c ]; then exit 0; fi
        exec {sys.executable} "$@"
        """))
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def setup_env(**extra) -> dict:
    return {**os.environ, "SETUP_PROGRESS_EVERY": str(EVERY), "TORCH_SPEC": "torch==2.13.0",
            **extra}


def test_setup_prints_a_line_at_least_every_interval_with_steps_and_sizes(fake_course):
    status, lines = timed_lines(["bash", "scripts/setup"], fake_course, setup_env())
    text = "\n".join(line for _, line in lines)
    assert status == 0, text
    # pip alone is silent for 6 s at a time; 3 s of slack for a machine under heavy load
    assert longest_gap(lines) < EVERY + 3, lines
    for step in ("[1/3] pip itself", "[2/3] torch (torch==2.13.0)", "[3/3] the course"):
        assert step in text
    assert "downloading torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl (192 MB)" in text
    assert "still downloading torch-2.13.0+cpu" in text and " of 192 MB (" in text
    assert "still working: installing 2 package(s)" in text
    assert "downloaded 2 file(s), 192 MB; installed 2 package(s)" in text
    assert "filelock" not in text  # small downloads get no line of their own
    for noise in ("is ignored", "Looking in indexes", "Progress ", "Editable installation",
                  "Please be careful", "WheelFile", "!!"):
        assert noise not in text, noise
    assert (fake_course / ".venv" / ".course-installed").exists()
    assert "Successfully installed" in (fake_course / ".venv" / "setup-pip.log").read_text()


def test_pips_exit_status_decides_and_its_error_is_shown(fake_course):
    env = setup_env(TORCH_SPEC="broken")
    status, lines = timed_lines(["bash", "scripts/setup"], fake_course, env)
    text = "\n".join(line for _, line in lines)
    assert status == 1
    assert "ERROR: No matching distribution found for broken" in text
    assert "pip exited with status 1; all it printed is in .venv/setup-pip.log" in text
    assert "'pip install --progress-bar raw broken' failed (exit 1)" in text
    assert "[3/3]" not in text and not (fake_course / ".venv" / ".course-installed").exists()


def test_on_a_terminal_one_live_line_is_rewritten_in_place(fake_course):
    """The same run on a pseudo-terminal: the byte count is one line redrawn with a carriage
    return, not a new line per tick."""
    import pty

    command = [sys.executable, str(fake_course / "scripts" / "pip_progress.py"), "--every", "1",
               "--", str(fake_course / ".venv" / "bin" / "python"), "-m", "pip", "install",
               "torch"]
    leader, follower = pty.openpty()
    proc = subprocess.Popen(command, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait() == 0
    text = out.decode()
    assert "\r\x1b[K  still downloading torch-2.13.0+cpu" in text
    assert text.count("\n") <= 3  # the download line, the summary, (no tick lines)
