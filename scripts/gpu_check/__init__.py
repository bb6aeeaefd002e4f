"""The GPU check's helpers: run notebooks in parallel (runner.py), summarise (summary.py)."""
