"""Checks: exercise autochecks that judge the learner's function on real ranks, and the
pitfall gate and coverage table that keep lesson notebooks honest (see CONTRIBUTING.md)."""

from course_lib.checks.lesson00 import check_rank_summary, check_same_random
from course_lib.checks.lesson01 import check_average_gradients, check_broadcast_parameters
from course_lib.checks.lesson02 import check_pick_device, check_to_device
from course_lib.checks.lesson03 import check_global_accuracy, check_read_epochs, check_train_uneven
from course_lib.checks.lesson04 import check_gradient_differences, check_wrap_model
from course_lib.checks.lesson05 import check_evaluate, check_global_batch_stats
from course_lib.checks.result import CheckResult

__all__ = ["CheckResult", "check_rank_summary", "check_same_random",
           "check_average_gradients", "check_broadcast_parameters",
           "check_pick_device", "check_to_device",
           "check_read_epochs", "check_global_accuracy", "check_train_uneven",
           "check_wrap_model", "check_gradient_differences",
           "check_global_batch_stats", "check_evaluate"]
