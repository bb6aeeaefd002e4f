"""Checks for lesson 04's exercises, one module per exercise:

- `wrap_model`: a DDP wrapper that trains a multi-task model, whose steps leave a head
  without a gradient (`check_wrap_model`);
- `gradient_differences`: the largest difference between any two ranks' gradients of each
  parameter (`check_gradient_differences`).

A notebook imports them from here: `from course_lib.checks.lesson04 import check_wrap_model`.
"""

from course_lib.checks.lesson04.gradient_differences import check_gradient_differences
from course_lib.checks.lesson04.wrap_model import check_wrap_model

__all__ = ["check_gradient_differences", "check_wrap_model"]
