"""python -m course_lib export: a notebook function becomes a torchrun script that needs only
torch (script.py: the script; source.py: reading code; carry.py: what it copies of course_lib)."""

from course_lib.export.script import export, main
from course_lib.export.source import ExportError

__all__ = ["ExportError", "export", "main"]
