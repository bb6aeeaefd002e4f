"""Checks for lesson 05's exercises, one module per exercise:

- `batch_stats`: the mean and variance of every rank's rows together, as SyncBatchNorm needs
  them (`check_global_batch_stats`);
- `evaluate`: an evaluation that rank 0 runs on its own, without hanging and without changing
  the model (`check_evaluate`).

A notebook imports them from here: `from course_lib.checks.lesson05 import check_evaluate`.
"""

from course_lib.checks.lesson05.batch_stats import check_global_batch_stats
from course_lib.checks.lesson05.evaluate import check_evaluate

__all__ = ["check_evaluate", "check_global_batch_stats"]
