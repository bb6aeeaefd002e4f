"""Widgets to explore a run: a step slider and rank toggles that redraw a plot.

Each explorer first displays the static figure (what nbmake and static viewers keep), then
returns the controls; moving them draws the chosen view below. Nothing is drawn into a widget
while the cell runs (see `redrawn_below`).
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets
from IPython.display import display
from matplotlib.figure import Figure

from course_lib.plots.batchnorm import batchnorm
from course_lib.plots.grads import gradients
from course_lib.plots.timeline import timeline
from course_lib.telemetry import Telemetry


def gradient_explorer(tel: Telemetry) -> widgets.Widget:
    """gradients(tel) with a step slider and rank toggles."""
    steps = tel.grads.unique("step")
    display(gradients(tel))
    slider = widgets.SelectionSlider(options=steps, value=steps[-1], description="step")
    return explorer(lambda step, ranks: gradients(tel, step, ranks), tel.ranks, step=slider)


def batchnorm_explorer(tel: Telemetry) -> widgets.Widget:
    """batchnorm(tel) with a layer menu, a channel slider and rank toggles."""
    layers = tel.batchnorm.unique("layer")
    display(batchnorm(tel, layers[0]))
    channels = max(len(v) for v in tel.batchnorm["batch_mean"])
    return explorer(lambda layer, channel, ranks: batchnorm(tel, layer, channel, ranks),
                    tel.ranks, layer=widgets.Dropdown(options=layers, description="layer"),
                    channel=widgets.IntSlider(0, 0, channels - 1, description="channel"))


def timeline_explorer(runs: dict[str, Telemetry]) -> widgets.Widget:
    """timeline() of several runs, with a run menu, a step slider and rank toggles."""
    names = list(runs)
    steps = runs[names[0]].spans.unique("step")
    display(timeline(runs[names[0]], steps=[steps[-1]]))
    return explorer(lambda run, step, ranks: timeline(runs[run], [step], ranks),
                    runs[names[0]].ranks,
                    run=widgets.Dropdown(options=names, description="run"),
                    step=widgets.SelectionSlider(options=steps, value=steps[-1],
                                                 description="step"))


def explorer(draw: Callable[..., Figure], ranks: list[int],
             **controls: widgets.ValueWidget) -> widgets.Widget:
    """Controls plus one toggle per rank; every change calls draw(**values, ranks=[...])."""
    toggles = [widgets.ToggleButton(value=True, description=f"rank {r}") for r in ranks]

    def draw_shown() -> Figure:
        shown = [r for r, toggle in zip(ranks, toggles) if toggle.value]
        return draw(ranks=shown, **{k: w.value for k, w in controls.items()})

    out = redrawn_below(draw_shown, *controls.values(), *toggles)
    return widgets.VBox([widgets.HBox(list(controls.values())), widgets.HBox(toggles), out])


def redrawn_below(draw: Callable[[], object], *controls: widgets.ValueWidget) -> widgets.Output:
    """An Output area that shows draw() anew whenever one of `controls` changes, and nothing
    before: the caller displays the first view as plain output.

    Never draw into an Output widget while its cell runs. A headless run (nbclient, under
    nbmake, papermill or the GPU check) answers each output captured there with a message on
    the kernel's shell channel, sent past pyzmq's asyncio wake-up (jupyter_client's
    Session.send on a synchronous shadow socket); a cell reply that lands meanwhile is then
    read only when the cell's timeout runs out, 300 s later under nbmake (docs/facts.md).
    """
    out = widgets.Output()

    def redraw(_: object = None) -> None:
        with out:
            out.clear_output(wait=True)
            display(draw())

    for control in controls:
        control.observe(redraw, "value")
    return out
