"""python -m course_lib.gate NOTEBOOK...: the pitfall gate (see course_lib.checks.gate)."""

import sys

from course_lib.checks.gate import main

if __name__ == "__main__":
    sys.exit(main())
