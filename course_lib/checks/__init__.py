"""Checks: exercise autochecks that judge the learner's function on real ranks, and the
pitfall gate and coverage table that keep lesson notebooks honest (see CONTRIBUTING.md)."""

from course_lib.checks.lesson00 import check_rank_summary, check_same_random
from course_lib.checks.lesson01 import check_average_gradients, check_broadcast_parameters
from course_lib.checks.result import CheckResult

__all__ = ["CheckResult", "check_rank_summary", "check_same_random",
           "check_average_gradients", "check_broadcast_parameters"]
