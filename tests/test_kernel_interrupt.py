"""JupyterLab's stop button: interrupt a kernel running a hung launch."""

import time

import pytest
from jupyter_client.manager import start_new_kernel
from procs import alive

pytestmark = pytest.mark.kernel  # a kernel or a cold Python process: not in --quick

HANG = """
import os, time, torch.distributed as dist
from course_lib import launch
def hang(folder):
    with open(f"{folder}/rank{dist.get_rank()}.pid", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
launch(hang, 2, args=(FOLDER,), timeout=120, backend="gloo")
"""


def _reply(client, msg_id, timeout):
    """The reply to msg_id. Under load, start_new_kernel's wait_for_ready sends kernel_info
    more than once, and a late kernel_info_reply would otherwise read as this reply."""
    deadline = time.monotonic() + timeout
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]


def _run(client, code, timeout=60):
    return _reply(client, client.execute(code), timeout)


def test_stop_button_kills_workers_and_the_kernel_stays_usable(tmp_path):
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        for round_ in range(2):  # interrupting works again after the first time
            folder = tmp_path / str(round_)
            folder.mkdir()
            msg_id = client.execute(HANG.replace("FOLDER", repr(str(folder))))
            deadline = time.monotonic() + 60
            while len(list(folder.glob("*.pid"))) < 2 or not all(
                    p.read_text() for p in folder.glob("*.pid")):
                assert time.monotonic() < deadline, "workers did not start"
                time.sleep(0.05)
            pids = {int(p.read_text()) for p in folder.glob("*.pid")}
            manager.interrupt_kernel()
            reply = _reply(client, msg_id, timeout=30)
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
            time.sleep(0.5)
            assert not alive(pids)
            content = _run(client, "launch(lambda: 7, 2, backend='gloo', echo=False).results")
            assert content["status"] == "ok"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
