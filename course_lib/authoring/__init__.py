"""Authoring tools: the pitfall gate, the cell metadata schema and pitfall registry, the
coverage table and the exercise builder. They read and write notebooks as JSON and reach
cells only through `course_lib.protocol`: nothing here imports torch or a lesson's checks.

Run them as `python -m course_lib {gate,coverage,exercises}` (see CONTRIBUTING.md).
"""
