"""CheckResult: what an exercise check decided, shown to the learner once."""

from __future__ import annotations

import html
from dataclasses import dataclass

from course_lib.protocol import CHECK_MIME


@dataclass(frozen=True)
class CheckResult:
    """`passed` and the `message` (the pass summary or the hint); truthy when passed.
    `kind` names what the check decided in a stable way, for the workshop board: "pass",
    "not-callable" or the hint's kind (common.Rejected.kind); never shown to the learner."""

    check: str
    passed: bool
    message: str
    kind: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def text(self) -> str:
        mark = "✔ PASS" if self.passed else "✘ NOT YET"
        return f"{mark}  {self.check}: {self.message}"

    def show(self) -> None:
        """Print the result; in a notebook also as a coloured box with a machine-readable copy."""
        from IPython import get_ipython

        if get_ipython() is None:
            print(self.text())
            return
        from IPython.display import display

        display(self._bundle(), raw=True)

    def _bundle(self) -> dict:
        colour = "#2e7d32" if self.passed else "#c62828"
        box = (f'<div style="border-left:4px solid {colour};padding:4px 10px;'
               f'white-space:pre-wrap">{html.escape(self.text())}</div>')
        data = {"check": self.check, "passed": self.passed, "message": self.message}
        return {"text/plain": self.text(), "text/html": box, CHECK_MIME: data}

    def _ipython_display_(self) -> None:
        """Shown already by the check that returned it; a cell ending with it adds nothing."""
