"""python -m course_lib doctor: check this machine is ready for the course."""

import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        from course_lib.checks.doctor import main as doctor

        return doctor()
    print("usage: python -m course_lib doctor", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
