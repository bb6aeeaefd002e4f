"""Authoring tools: they read and write the course's notebooks and pages as JSON and text,
and never run a lesson's code.

- the pitfall gate: `gate`, with `cell_schema` (the metadata), `outputs` (what a cell
  showed) and `exercise_cells` (stubs and checks);
- the exercise builder: `exercises`, with `stubs`;
- the generated tables and pages: `coverage`, `course_map`, `run_times`, `run_facts`, all
  written through `readme_blocks`.

They reach cells only through `course_lib.protocol`, and the pitfall ids through the
registry `course_lib.pitfalls` (outside this package): nothing here imports torch or a
lesson's checks. Each tool is a command of `python -m course_lib` (`--help` lists them all;
CONTRIBUTING.md says when to run which).
"""
