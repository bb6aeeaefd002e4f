"""Launching: run a notebook-defined function on real DDP ranks."""

from course_lib.launching.errors import DistributedError, RankFailure
from course_lib.launching.launcher import launch
from course_lib.launching.run import LogLine, Run

__all__ = ["launch", "DistributedError", "RankFailure", "Run", "LogLine"]
