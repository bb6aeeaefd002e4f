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
    monkeypatch.setattr(doctor, "check_packages", lambda for_gpu_check=False: [])
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


def test_the_doctor_reads_a_cgroup_v2_cpu_limit(tmp_path):
    own = tmp_path / "cgroup"
    own.write_text("0::/user.slice/learner1\n")
    (tmp_path / "fs" / "user.slice" / "learner1").mkdir(parents=True)
    (tmp_path / "fs" / "user.slice" / "learner1" / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "fs" / "user.slice" / "cpu.max").write_text("max 100000\n")
    assert doctor.cgroup_cpu_limit(tmp_path / "fs", own) == 0.5


def test_the_doctor_reads_a_cgroup_v1_cpu_limit_and_none(tmp_path):
    own = tmp_path / "cgroup"
    own.write_text("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    folder = tmp_path / "fs" / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert doctor.cgroup_cpu_limit(tmp_path / "fs", own) == 2.0
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert doctor.cgroup_cpu_limit(tmp_path / "fs", own) is None


def test_a_cpu_limit_below_two_cores_is_a_warning(monkeypatch):
    monkeypatch.setattr(doctor, "cgroup_cpu_limit", lambda: 0.5)
    check = doctor.check_cores()
    assert check.status == doctor.WARN and "0.5 (a cgroup CPU limit" in check.detail


def without_jupyterlab(monkeypatch):
    """This machine as a GPU node is: every package but jupyterlab; the slow checks stubbed."""
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda p: None if p == "jupyterlab" else real(p))
    for name in ("check_python", "check_cores", "check_gpus", "check_backends",
                 "check_loopback", "check_tracebacks"):
        monkeypatch.setattr(doctor, name, lambda name=name: doctor.Check(name, doctor.PASS, ""))
    monkeypatch.setattr(doctor, "check_launch", lambda: [])


def test_jupyterlab_is_not_needed_for_the_gpu_check(monkeypatch, capsys):
    without_jupyterlab(monkeypatch)
    assert doctor.main(["--for-gpu-check"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("jupyterlab "))
    assert row.split()[1] == "SKIP" and "not installed: not needed by the GPU check" in row
    assert "All checks passed: ready for the GPU check." in out


def test_a_learner_still_needs_jupyterlab(monkeypatch, capsys):
    without_jupyterlab(monkeypatch)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("jupyterlab "))
    assert row.split()[1:3] == ["FAIL", "not"] and "run the README's set-up command" in row
    assert "FAILED: jupyterlab" in out
