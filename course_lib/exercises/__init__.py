"""Exercises from one source: solutions/NN_*.ipynb generate exercises/NN_*.ipynb."""

from course_lib.exercises.stubs import MarkerError, exercise_notebook, stub_source

__all__ = ["MarkerError", "exercise_notebook", "stub_source"]
