"""The instructor's page: the board's view (store.Board.view) as one HTML page that reloads
itself. A grid of learners by checks, who is stuck and why, and each check's most common
hint, named by its template (labels.label, added by service.labelled)."""

from __future__ import annotations

import html
import time

REFRESH_S = 15
STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:center}td.l{text-align:left}
.pass{background:#c8e6c9}.fail{background:#fff3cd}.stuck{background:#f8bbd0;font-weight:bold}
small{color:#555}"""


def render(view: dict) -> str:
    """The whole page, from the labelled view (service.labelled)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(view["now"]))
    rule = view["stuck_rule"]
    head = [f"<!doctype html><meta charset=utf-8><meta http-equiv=refresh content={REFRESH_S}>",
            f"<title>Workshop board</title><style>{STYLE}</style>",
            f"<h1>Workshop board</h1><p><small>{len(view['learners'])} learners, updated "
            f"{stamp}, reloads every {REFRESH_S} s. Stuck: {rule['failures']} failed "
            f"attempts, or {rule['seconds'] / 60:.0f} minutes on one check without a pass. "
            "JSON: <a href=api/board>api/board</a></small></p>"]
    if not view["rows"]:
        return "\n".join([*head, "<p>No verdict yet: learners appear here when they run an "
                                  "exercise check.</p>"])
    return "\n".join([*head, "<h2>Learners by checks</h2>", _grid(view),
                      "<h2>Stuck now</h2>", _stuck(view),
                      "<h2>Most common hint per check</h2>", _hints(view)])


def _grid(view: dict) -> str:
    e = html.escape
    checks = [(c["exercise"], c["check"]) for c in view["checks"]]
    cells = {(r["learner"], r["exercise"], r["check"]): r for r in view["rows"]}
    head = "".join(f"<th>exercise {e(x)}<br><small>{e(c)}</small></th>" for x, c in checks)
    lines = [f"<table><tr><th>learner</th>{head}</tr>"]
    for learner in view["learners"]:
        row = "".join(_cell(cells.get((learner, x, c))) for x, c in checks)
        lines.append(f"<tr><td class=l>{e(learner)}</td>{row}</tr>")
    return "\n".join(lines) + "</table>"


def _cell(row: dict | None) -> str:
    if row is None:
        return "<td></td>"
    tries = f"{row['attempts']} tr{'y' if row['attempts'] == 1 else 'ies'}"
    if row["passed_at"] is not None:
        return f"<td class=pass>&#10004; <small>{tries}</small></td>"
    css = "stuck" if row["stuck"] else "fail"
    return (f"<td class={css} title=\"{html.escape(row['kind_label'])}\">&#10008; "
            f"<small>{tries}</small></td>")


def _stuck(view: dict) -> str:
    if not view["stuck"]:
        return "<p>nobody</p>"
    items = "".join(f"<li>{html.escape(s['learner'])}: {html.escape(s['exercise'])} "
                    f"{html.escape(s['check'])} ({html.escape(s['stuck'])})</li>"
                    for s in view["stuck"])
    return f"<ul>{items}</ul>"


def _hints(view: dict) -> str:
    e = html.escape
    lines = ["<table><tr><th>check</th><th>passed / tried</th><th>most common hint</th>"
             "<th>learners who got it</th></tr>"]
    for c in view["checks"]:
        hint = (f"{e(c['top_hint_label'])}<br><small>{e(c['top_hint'])}</small>"
                if c["top_hint"] else "")
        lines.append(f"<tr><td class=l>{e(c['exercise'])} {e(c['check'])}</td>"
                     f"<td>{c['passed']} / {c['tried']}</td><td class=l>{hint}</td>"
                     f"<td>{c['top_hint_learners'] or ''}</td></tr>")
    return "\n".join(lines) + "</table>"
