"""Checks for lesson 02's exercises, one module per exercise:

- `pick_device`: each rank picks its own device (`check_pick_device`);
- `to_device`: a training step puts everything it uses on that device (`check_to_device`).

A notebook imports them from here: `from course_lib.checks.lesson02 import check_pick_device`.
"""

from course_lib.checks.lesson02.pick_device import check_pick_device
from course_lib.checks.lesson02.to_device import check_to_device

__all__ = ["check_pick_device", "check_to_device"]
