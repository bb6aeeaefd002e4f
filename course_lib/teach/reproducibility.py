"""Reproducibility: a checksum of a model's weights (equal only when every bit is equal), the
largest difference between two sets of weights, and pictures of both."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

# float32's machine epsilon: the gap between 1.0 and the next float32, the size of one
# rounding step relative to a value.
FLOAT32_EPS = torch.finfo(torch.float32).eps


def checksum(weights: torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[torch.Tensor],
             digits: int = 10) -> str:
    """A short SHA-256 of the weights' bytes: two runs agree on it only if every bit agrees."""
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict()
    tensors = weights.values() if isinstance(weights, Mapping) else weights
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:digits]


def largest_gap(a: Mapping[str, torch.Tensor],
                b: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """(largest absolute difference, largest difference relative to the largest |value|)."""
    gap = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    scale = max(b[k].double().abs().max().item() for k in b)
    return gap, gap / scale


def plot_checksums(rows: Mapping[str, list[str]],
                   title: str = "Checksum of the final weights") -> Any:
    """One row per setup, one box per run: runs with the same colour in a row are bitwise
    identical; a row of one colour is reproducible."""
    import matplotlib.pyplot as plt

    from course_lib.plots.style import BLUE, GREEN, ORANGE, PURPLE, SKY, VERMILLION, new_figure

    runs = max(len(v) for v in rows.values())
    fig = new_figure(3.2 + 1.25 * runs, 0.5 * len(rows) + 0.9)
    ax = fig.add_subplot()
    palette = (VERMILLION, BLUE, ORANGE, PURPLE, SKY)  # green is kept for "identical"
    for y, sums in enumerate(rows.values()):
        first_seen = list(dict.fromkeys(sums))
        for x, value in enumerate(sums):
            colour = (GREEN if len(first_seen) == 1
                      else palette[first_seen.index(value) % len(palette)])
            ax.add_patch(plt.Rectangle((x + 0.04, -y - 0.42), 0.92, 0.84, color=colour, alpha=0.35))
            ax.text(x + 0.5, -y, value, ha="center", va="center", family="monospace", fontsize=9)
        verdict = "identical" if len(first_seen) == 1 else f"{len(first_seen)} different"
        ax.text(runs + 0.1, -y, verdict, va="center", fontsize=9)
    ax.set_xlim(0, runs + 1.3)
    ax.set_ylim(-len(rows) + 0.45, 0.8)
    ax.set_yticks([-y for y in range(len(rows))], list(rows))
    ax.set_xticks([x + 0.5 for x in range(runs)], [f"run {x + 1}" for x in range(runs)])
    ax.xaxis.tick_top()
    for side in ax.spines.values():
        side.set_visible(False)
    ax.tick_params(length=0)
    ax.set_title(title + " (same colour in a row: the same bits)", fontsize=10, pad=22)
    return fig


def plot_world_size_gaps(gaps: Mapping[int, float], repeat_gap: float, steps: int) -> Any:
    """Largest relative difference of each world size's weights from one process's, on a log
    scale, beside float32's rounding step and a second run at the same size."""
    from course_lib.plots.style import GREEN, ORANGE, new_figure

    fig = new_figure(6.4, 3.0)
    ax = fig.add_subplot()
    labels = [f"{n} ranks\nvs 1" for n in gaps] + ["same size,\nrun 2 vs run 1"]
    values = list(gaps.values()) + [repeat_gap]
    floor = FLOAT32_EPS / 100  # where a zero is drawn on the log scale
    bars = ax.bar(labels, [max(v, floor) for v in values],
                  color=[ORANGE] * len(gaps) + [GREEN])
    for bar, v in zip(bars, values):
        ax.text(bar.get_x() + bar.get_width() / 2, max(v, floor) * 1.4,
                "0 (bitwise equal)" if v == 0 else f"{v:.1e}", ha="center", fontsize=9)
    ax.axhline(FLOAT32_EPS, color="grey", ls="--", lw=1)
    ax.text(len(values) - 0.5, FLOAT32_EPS * 1.3, "float32 rounding step", ha="right",
            color="grey", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(floor / 2, max(max(values), FLOAT32_EPS) * 30)
    ax.set_ylabel("largest |difference|\n/ largest |weight|")
    ax.set_title(f"Final weights after {steps} steps on the same global batches", fontsize=10)
    return fig


# the switches of seeding_explorer: label -> what seeding() is told
SEED_SWITCHES = {"seed torch": "seed_torch", "seed random": "seed_random",
                 "seed NumPy": "seed_numpy", "deterministic algorithms": "deterministic"}


def seeding(seed_torch: bool = False, seed_random: bool = False, seed_numpy: bool = False,
            deterministic: bool = False, base_seed: int = 1234) -> Callable[[int], None]:
    """A per-rank setup that seeds only what it is told to, with base_seed + rank."""
    def setup(rank: int) -> None:
        if seed_torch:
            torch.manual_seed(base_seed + rank)
        if seed_random:
            random.seed(base_seed + rank)
        if seed_numpy:
            np.random.seed(base_seed + rank)
        torch.use_deterministic_algorithms(deterministic)
    return setup


def seeding_explorer(checksums: Callable[..., list[str]],
                     table: Mapping[str, list[str]]) -> Any:
    """Tick what to seed, choose DataLoader workers, press the button: two launches with that
    setup are added as a row under the table's rows (shown first, as a static figure)."""
    import ipywidgets as widgets
    from IPython.display import display

    rows = dict(table)
    display(plot_checksums(rows))
    fit = widgets.Layout(width="auto")  # each box as wide as its label: four fit in one row
    boxes = {label: widgets.Checkbox(value=False, description=label, indent=False, layout=fit)
             for label in SEED_SWITCHES}
    workers = widgets.Dropdown(options=[0, 2], value=2, description="workers")
    button = widgets.Button(description="run twice")
    out = widgets.Output()

    def run(_: object = None) -> None:
        ticked = [label for label, box in boxes.items() if box.value]
        setup = seeding(**{SEED_SWITCHES[label]: True for label in ticked})
        label = f"{', '.join(ticked) or 'nothing seeded'}; {workers.value} workers"
        button.description = "running..."
        rows[label] = checksums(2, setup=setup, num_workers=workers.value)
        button.description = "run twice"
        with out:
            out.clear_output(wait=True)
            display(plot_checksums(rows))

    button.on_click(run)
    return widgets.VBox([widgets.HBox(list(boxes.values())),
                         widgets.HBox([workers, button]), out])
