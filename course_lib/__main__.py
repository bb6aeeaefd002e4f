"""python -m course_lib COMMAND: the course's one command line (see --help)."""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module whose main(argv) runs it, what it does). Each module is imported only
# when its command runs: the authoring commands never import torch.
COMMANDS = {
    "doctor": ("course_lib.doctor", "check that this machine is ready for the course"),
    "gate": ("course_lib.authoring.gate",
             "run (or read executed) notebooks and judge every pitfall and exercise cell"),
    "coverage": ("course_lib.authoring.coverage",
                 "the pitfall coverage table of the lessons, or write it into README.md"),
    "exercises": ("course_lib.authoring.exercises",
                  "generate exercises/ from solutions/ (build), or check it is fresh"),
    "map": ("course_lib.authoring.course_map",
            "the course map (symptom -> pitfall -> lesson), or write it and the instructor "
            "guide's lesson table into docs/"),
    "xray": ("course_lib.xray.cli",
             "run a DDP training script on N ranks and report the pitfalls it shows"),
    "export": ("course_lib.export",
               "write a notebook's training function as a script that torchrun runs"),
    "run-times": ("course_lib.authoring.run_times",
                  "write each notebook's measured time (from a test run) into the README"),
    "run-facts": ("course_lib.authoring.run_facts",
                  "write a run's test counts, CI time, .venv size and doctor table into the "
                  "docs"),
}


def main(argv: list[str] | None = None) -> int:
    """Run one command with the arguments that follow it."""
    listing = "\n".join(f"  {name:<10} {what}" for name, (_, what) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="python -m course_lib", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The course's tools. `python -m course_lib COMMAND --help` says more.",
        epilog=f"commands:\n{listing}")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND",
                        help=f"one of: {', '.join(COMMANDS)}")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return module.main(args.args)


if __name__ == "__main__":
    sys.exit(main())
