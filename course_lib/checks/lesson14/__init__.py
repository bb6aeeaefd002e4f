"""Check for lesson 14's exercise: the main() that makes a notebook training function
torchrun-ready.

- `training`: the given train() (which a notebook imports from here) and the one-process
  result it must reach;
- `entry`: the script torchrun starts, which calls the learner's main() and reports what it
  did with the process group;
- `main_check`: `check_main`, which runs torchrun as one node and as two nodes, and its hints.

A notebook imports them from here: `from course_lib.checks.lesson14 import check_main, train`.
"""

from course_lib.checks.lesson14.main_check import check_main
from course_lib.checks.lesson14.training import one_process, train

__all__ = ["check_main", "one_process", "train"]
