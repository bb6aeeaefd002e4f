"""Plots of a run's telemetry; each function returns a matplotlib Figure.

Ranks keep one look everywhere: an Okabe-Ito colour plus a line style, marker and hatch,
so they stay apart for colour-blind readers and in greyscale.
"""

from course_lib.plots.batchnorm import batchnorm
from course_lib.plots.explore import (
    batchnorm_explorer,
    explorer,
    gradient_explorer,
    timeline_explorer,
)
from course_lib.plots.grads import gradients
from course_lib.plots.samples import samples
from course_lib.plots.scalars import compare_runs, rank_bars, scalars
from course_lib.plots.style import rank_bar_style, rank_style
from course_lib.plots.timeline import timeline

__all__ = ["gradients", "batchnorm", "samples", "timeline", "scalars", "rank_bars",
           "compare_runs", "gradient_explorer", "batchnorm_explorer", "timeline_explorer",
           "explorer", "rank_style", "rank_bar_style"]
