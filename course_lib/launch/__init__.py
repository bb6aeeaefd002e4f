"""Launching: run a notebook-defined function on real DDP ranks."""

from course_lib.launch.launcher import launch
from course_lib.launch.report import DistributedError, RankFailure
from course_lib.launch.run import LogLine, Run

__all__ = ["launch", "DistributedError", "RankFailure", "Run", "LogLine"]
