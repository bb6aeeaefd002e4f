"""python -m course_lib doctor: a readable table, and an exit code that tells."""

import subprocess
import sys

import pytest

from course_lib import doctor


@pytest.mark.kernel  # a cold Python process that launches ranks
def test_doctor_passes_here_and_shows_every_check():
    out = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("Python", "torch", "jupyterlab", "CPU cores", "GPUs", "backends",
                 "2-rank launch + all-reduce", "listening addresses", "rank tracebacks"):
        assert name in out.stdout
    assert "All checks passed" in out.stdout


def test_a_failing_check_makes_the_doctor_fail(monkeypatch, capsys):
    """Only the backends check fails: every other check is stubbed to pass, so that what
    this machine has (a GPU, a torch without jupyterlab, one core) cannot change the verdict
    line (a second failure would read "FAILED: jupyterlab, backends")."""
    def broken_backends():
        return doctor.Check("backends", doctor.FAIL, "gloo missing")

    for name in ("check_python", "check_cores", "check_gpus", "check_loopback"):
        monkeypatch.setattr(doctor, name, lambda name=name: doctor.Check(name, doctor.PASS, ""))
    monkeypatch.setattr(doctor, "check_packages", lambda: [])
    monkeypatch.setattr(doctor, "check_backends", broken_backends)
    monkeypatch.setattr(doctor, "check_launch", lambda: [])
    monkeypatch.setattr(doctor, "check_tracebacks", lambda: [])
    assert doctor.main() == 1
    assert "FAILED: backends\n" in capsys.readouterr().out + "\n"


def test_unknown_command_prints_usage():
    out = subprocess.run([sys.executable, "-m", "course_lib", "docter"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice: 'docter'" in out.stderr
    assert "usage: python -m course_lib" in out.stderr
