"""Exercise checks: each judges the learner's function on real ranks and shows a CheckResult.

One module per lesson, `checks/lessonNN.py` (or, once a lesson passes 300 lines, a package
`checks/lessonNN/` with one module per exercise that re-exports its `check_*` functions),
importing only the shared base (`common`, `result`), never another lesson. A notebook
imports its own lesson's checks:

    from course_lib.checks.lesson03 import check_read_epochs
"""
