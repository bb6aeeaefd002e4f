"""Check for lesson 11's exercise: a Checkpointer whose save/load make a training job that
is killed at a random step, or in the middle of a save, and relaunched end with the weights of
an uninterrupted run.

- `training_job`: the given loop the learner's Checkpointer runs in, and the true results
  (an uninterrupted run, and resumes that each leave one piece out);
- `resume_check`: `check_resume`, which kills and relaunches that job, and its hints.

A notebook imports the check from here: `from course_lib.checks.lesson11 import check_resume`.
"""

from course_lib.checks.lesson11.resume_check import check_resume

__all__ = ["check_resume"]
