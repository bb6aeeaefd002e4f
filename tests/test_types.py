"""The type checker (issue 37): mypy over all of course_lib with the repository's mypy.ini,
strict on the parts whose types others read (launching/ and xray/).

mypy, not pyright: it installs with pip like every other tool here, where pyright needs a
Node.js runtime the machines and learners' set-up do not have; and it reads torch's own
inline types, as pyright does.
"""

import configparser
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Checked strictly: every flag of `mypy --strict` that can be set per module (the two
# global ones, warn_unused_configs and warn_redundant_casts, are set in [mypy]).
STRICT_PACKAGES = ["course_lib.launching.*", "course_lib.xray.*"]
STRICT_FLAGS = ["disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls",
                "disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs",
                "disallow_untyped_decorators", "warn_unused_ignores", "warn_return_any",
                "strict_equality", "extra_checks"]


def _config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "mypy.ini")
    return config


def test_mypy_passes_over_course_lib():
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_strict_parts_have_every_strict_flag():
    config = _config()
    strict = [s for s in config.sections()
              if set(STRICT_PACKAGES) <= set(s.removeprefix("mypy-").split(","))]
    assert len(strict) == 1, f"no section names {STRICT_PACKAGES} together in mypy.ini"
    section = config[strict[0]]
    assert [f for f in STRICT_FLAGS if not section.getboolean(f, False)] == []
    assert section.get("implicit_reexport") == "False"


def test_no_error_kind_is_switched_off_in_a_strict_part():
    config, packages = _config(), tuple(p.removesuffix("*") for p in STRICT_PACKAGES)
    off = [s for s in config.sections() if "disable_error_code" in config[s]
           and any(m.startswith(packages) for m in s.removeprefix("mypy-").split(","))]
    assert off == []
