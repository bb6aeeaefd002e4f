"""Exercise checks: each judges the learner's function on real ranks and shows a CheckResult.

One module per lesson, `checks/lessonNN.py`, importing only the shared base (`common`,
`result`), never another lesson. A notebook imports its own lesson's checks:

    from course_lib.checks.lesson03 import check_read_epochs
"""
