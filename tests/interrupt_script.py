"""Run by test_interrupt.py as a separate process: launches that the test interrupts."""

import os
import signal
import sys
import time

import cloudpickle
import torch.distributed as dist

from course_lib import launch

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def hang(folder):
    with open(os.path.join(folder, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def main(folder, rounds):
    for i in range(rounds):
        try:
            launch(hang, 2, args=(os.path.join(folder, str(i)),), timeout=120, backend="gloo",
                   echo=False)
        except KeyboardInterrupt:
            print(f"interrupted {i}", flush=True)
        run = launch(lambda: dist.get_rank(), 2, backend="gloo", echo=False)
        print("usable", run.results, flush=True)


if __name__ == "__main__":
    # Interrupts raise KeyboardInterrupt, as in a kernel, even when this was started with
    # SIGINT ignored (a CI run started as a background job: Python keeps SIG_IGN then).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main(sys.argv[1], int(sys.argv[2]))
