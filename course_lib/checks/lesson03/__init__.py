"""Checks for lesson 03's exercises, one module per exercise:

- `read_epochs`: a sharded, reshuffled training loader (`check_read_epochs`);
- `global_accuracy`: an accuracy that counts every sample once over all ranks
  (`check_global_accuracy`);
- `train_uneven`: a training loop that survives uneven data (`check_train_uneven`);
- `counted_reads`: the datasets' shared-memory read counts and the DataLoader start method
  that the first two use.

A notebook imports them from here: `from course_lib.checks.lesson03 import check_read_epochs`.
"""

from course_lib.checks.lesson03.global_accuracy import check_global_accuracy
from course_lib.checks.lesson03.read_epochs import check_read_epochs
from course_lib.checks.lesson03.train_uneven import check_train_uneven

__all__ = ["check_global_accuracy", "check_read_epochs", "check_train_uneven"]
