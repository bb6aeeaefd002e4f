"""IPython start-up file for the browser check's kernels (copied into IPYTHONDIR's startup
folder): for every figure the inline backend turns into a PNG, log its pixel size and the
height in pixels of its smallest visible text, so the check can tell what size that text is
shown at. Not imported by anything else."""

import base64
import json
import os
import struct

import IPython.core.pylabtools as pylabtools

_print_figure = pylabtools.print_figure


def _png_size(data) -> tuple[int, int] | None:
    raw = base64.b64decode(data) if isinstance(data, str) else data
    if not raw or raw[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return struct.unpack(">II", raw[16:24])


def _smallest_text(fig, dpi: float) -> tuple[float, str] | None:
    from matplotlib.text import Text

    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and (t.axes is None or t.axes.get_visible())]
    if not texts:
        return None
    small = min(texts, key=lambda t: t.get_fontsize())
    return small.get_fontsize() * dpi / 72, small.get_text().strip()[:40]


def _logged_print_figure(fig, fmt="png", bbox_inches="tight", base64=False, **kwargs):
    data = _print_figure(fig, fmt, bbox_inches, base64, **kwargs)
    size = _png_size(data) if data is not None and fmt in ("png", "retina") else None
    dpi = kwargs.get("dpi", fig.dpi * (2 if fmt == "retina" else 1))
    smallest = _smallest_text(fig, dpi) if size else None
    if smallest and os.environ.get("COURSE_FIGURE_TEXT_LOG"):
        with open(os.environ["COURSE_FIGURE_TEXT_LOG"], "a") as log:
            log.write(json.dumps({"width": size[0], "height": size[1],
                                  "text_px": round(smallest[0], 2), "text": smallest[1]}) + "\n")
    return data


pylabtools.print_figure = _logged_print_figure
