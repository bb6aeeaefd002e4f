"""Checks for lesson 10's exercises: decisions that change which collectives run must be taken
together.

- `converged`: `check_train_until_converged`, stop early on the loss averaged over all ranks
  (the lesson's own fix, in a function);
- `skip`: `check_skip_bad_batches`, the same rule on a new decision: skip a batch on every
  rank when any rank's loss is not finite.

A notebook imports the checks from here: `from course_lib.checks.lesson10 import ...`.
"""

from course_lib.checks.lesson10.converged import check_train_until_converged
from course_lib.checks.lesson10.skip import check_skip_bad_batches

__all__ = ["check_skip_bad_batches", "check_train_until_converged"]
