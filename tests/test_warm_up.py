"""The workers' forkserver starts in the background when a notebook imports `launch`, the
first launch says once why it waits, and processes that never launch do not start one."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import torch.distributed as dist
    from course_lib import launch
    warming = [t.name for t in threading.enumerate() if t.name == "course_lib-warm-up"]
    def world():
        return dist.get_world_size()
    first = launch(world, 2, backend="gloo")
    second = launch(world, 2, backend="gloo")
    print("warming thread:", warming, "results:", first.results, second.results)
""")

SPAWNED = textwrap.dedent("""
    import multiprocessing as mp
    from course_lib import launch  # noqa: F401 - a spawned child imports this again
    def child():
        import course_lib.launching.forkserver as fs
        from course_lib import launch  # noqa: F401 - the import alone must start nothing
        print("child warming:", fs._warming)
    if __name__ == "__main__":
        p = mp.get_context("spawn").Process(target=child)
        p.start(); p.join()
        print("exit", p.exitcode)
""")


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_import_starts_the_forkserver_and_the_first_launch_says_so_at_most_once(tmp_path):
    out = _python(SCRIPT, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "warming thread: ['course_lib-warm-up']" in out.stdout
    assert "results: [2, 2] [2, 2]" in out.stdout
    assert out.stdout.count("starting workers (first launch only)...") <= 1
    assert "Traceback" not in out.stderr


def test_a_multiprocessing_child_that_imports_launch_starts_nothing(tmp_path):
    out = _python(SPAWNED, tmp_path)
    assert "child warming: None" in out.stdout and "exit 0" in out.stdout, out.stderr
    assert "course_lib-warm-up" not in out.stderr
    assert "Traceback" not in out.stderr
