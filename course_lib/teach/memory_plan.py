"""Lesson 13's planning pictures: the loss under every strategy, the predicted GiB per rank of
a model not built yet against the world size, and a calculator widget, all from
`memory.predict` (the formula the lesson checks against measured ranks)."""

from __future__ import annotations

from course_lib.teach.memory import OPTIMIZERS, PRECISIONS, STRATEGIES, predict


def plot_losses(curves: dict[str, list[float]], reference: str):
    """Left: the reference run's loss at each step (every other run lies on it). Right: each
    other run's distance from it, beside float32's resolution (2**-23 relative); a colour per
    strategy, a line style per world size ("name, N ranks" keys)."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import BLACK, new_figure

    fig = new_figure(8.2, 3.6)
    left, right = fig.subplots(1, 2)
    want = curves[reference]
    steps = range(1, len(want) + 1)
    left.plot(steps, want, color=BLACK, marker="o", label=reference)
    names = list(dict.fromkeys(key.rsplit(", ", 1)[0] for key in curves))
    sizes = list(dict.fromkeys(key.rsplit(", ", 1)[1] for key in curves))
    for key, values in curves.items():
        if key == reference:
            continue
        name, size = key.rsplit(", ", 1)
        i, j = names.index(name), sizes.index(size)
        gaps = [max(abs(a - b) / abs(b), 1e-12) for a, b in zip(values, want)]
        look = {**series_style(i), "linestyle": series_style(j)["linestyle"]}
        right.plot(steps, gaps, label=key, fillstyle="none", **look)
    right.axhline(2**-23, color=BLACK, linestyle="--", label="float32 resolution")
    right.set_yscale("log")
    left.set_ylabel("loss (mean over the global batch)")
    right.set_ylabel(f"relative gap to {reference}")
    for ax in (left, right):
        ax.set_xlabel("step")
    left.set_title(f"{reference}: every run lies on it", fontsize="medium")
    right.set_title("Each run's gap (1e-12 = equal)", fontsize="medium")
    fig.legend(*right.get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize="small")
    return fig


def readable(n_bytes: float) -> str:
    """Bytes with a binary unit and 4 significant digits: '16.03 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n_bytes) < 1024:
            return f"{n_bytes:.4g} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.4g} TiB"


WORLD_SIZES = tuple(2**k for k in range(11))  # the calculator's world sizes: 1, 2, 4, ..., 1024


def calculator():
    """A widget: parameters, world size, strategy, precision, optimizer, the largest unit and
    DDP's gradient_as_bucket_view -> bytes per rank, from `predict`. Every label fits its
    box at JupyterLab's width (the browser check fails on a label cut with an ellipsis), and
    the world size moves through powers of two."""
    import ipywidgets as widgets

    wide = {"description_width": "15em"}  # the longest label, "largest unit, % of model"
    layout = widgets.Layout(width="38em")
    menu = widgets.Layout(width="28em")  # room for "bf16 DeepSpeed" beside its label
    n = widgets.FloatLogSlider(value=7e9, base=10, min=4, max=12, step=1e-4,
                               readout_format=".3g", description="parameters", style=wide,
                               layout=layout)
    ranks = widgets.SelectionSlider(options=WORLD_SIZES, value=8, description="world size",
                                    style=wide, layout=layout)
    strategy = widgets.Dropdown(options=STRATEGIES, value="FSDP2", description="strategy",
                                layout=menu, style=wide)
    precision = widgets.Dropdown(options=list(PRECISIONS), value="bf16 PyTorch",
                                 description="precision", layout=menu, style=wide)
    optimizer = widgets.Dropdown(options=list(OPTIMIZERS), value="Adam",
                                 description="optimizer", layout=menu, style=wide)
    unit = widgets.FloatSlider(value=3.0, min=0.1, max=100, step=0.1, style=wide,
                               description="largest unit, % of model", layout=layout)
    view = widgets.Checkbox(value=False, description="gradient_as_bucket_view=True (DDP)",
                            indent=False, layout=widgets.Layout(width="auto",
                                                                margin="0 0 0 15em"))
    out = widgets.HTML()

    def redraw(_: object = None) -> None:
        got = predict(int(n.value), ranks.value, strategy.value, precision.value,
                      optimizer.value, int(n.value * unit.value / 100), view.value)
        lines = [f"{k}: {readable(v)}" for k, v in got.items()]
        lines.append(f"<b>per rank, without activations: {readable(sum(got.values()))}</b>")
        out.value = "<br>".join(lines)

    for w in (n, ranks, strategy, precision, optimizer, unit, view):
        w.observe(redraw, "value")
    redraw()
    return widgets.VBox([n, ranks, strategy, precision, optimizer, unit, view, out])


def plot_planning(n_params: float, unit_share: float = 0.03, optimizer: str = "Adam"):
    """Predicted GiB per rank (without activations) against the world size: DDP, ZeRO-1 and
    FSDP2 as PyTorch stores bf16 training (DDP's default buckets included), and DeepSpeed's
    ZeRO-2 with its 2+2+12 layout, labelled as such; an 80 GB (74.5 GiB) GPU for scale."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import HIGHLIGHT, new_figure

    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    lines = {"DDP + autocast": ("DDP", "bf16 PyTorch"),
             "ZeRO-1 + autocast": ("ZeRO-1", "bf16 PyTorch"),
             "FSDP2 + MixedPrecisionPolicy": ("FSDP2", "bf16 PyTorch"),
             "DeepSpeed ZeRO-2 (2+2+12)": ("ZeRO-2", "bf16 DeepSpeed")}
    fig = new_figure(8.0, 4.2)
    ax = fig.subplots()
    for i, (label, (strategy, precision)) in enumerate(lines.items()):
        gib = [sum(predict(int(n_params), n, strategy, precision, optimizer,
                           int(n_params * unit_share)).values()) / 2**30 for n in sizes]
        ax.plot(sizes, gib, label=label, **series_style(i))
    ax.axhline(80e9 / 2**30, color=HIGHLIGHT, linestyle="--", label="an 80 GB GPU (A100, H100)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_yscale("log")
    ax.set_xlabel("world size (GPUs)")
    ax.set_ylabel("GiB per rank (no activations)")
    ax.set_title(f"{n_params / 1e9:g}B parameters, bf16 training, {optimizer}",
                 fontsize="medium")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize="small")
    return fig
