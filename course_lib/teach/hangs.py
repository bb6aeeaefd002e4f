"""Pictures for lesson 10 (hangs and desync): where each rank would stop on its own loss and
where the ranks' mean says to stop, what each rank read from an asynchronous all-reduce
against the true value, and what each way of ending uneven inputs costs a step.
(The desync report's own picture is teach.desync_picture.plot_desync.)"""

from __future__ import annotations


def first_below(values: list[float], target: float) -> int | None:
    """The first step whose value is below target (None if none is)."""
    return next((i for i, v in enumerate(values) if v < target), None)


def plot_stop_decisions(losses: list[list[float]], target: float):
    """Each rank's own loss per step, the mean over ranks, the target, and where each rank
    would stop on its own loss (a cross) against where the mean says stop (a dashed line)."""
    from course_lib.plots.style import BLACK, HIGHLIGHT, new_figure, rank_style

    steps = min(len(values) for values in losses)
    mean = [sum(values[i] for values in losses) / len(losses) for i in range(steps)]
    fig = new_figure(7.0, 3.4)
    ax = fig.subplots()
    for rank, values in enumerate(losses):
        ax.plot(values[:steps], label=f"rank {rank}'s own loss", markersize=3,
                **rank_style(rank))
        alone = first_below(values[:steps], target)
        if alone is not None:
            ax.plot(alone, values[alone], "x", color=HIGHLIGHT, markersize=12, mew=3)
            ax.annotate(f"rank {rank} alone\nstops at step {alone}", (alone, values[alone]),
                        textcoords="offset points", xytext=(-12, -32), fontsize="small",
                        color=HIGHLIGHT, ha="right")
    ax.plot(mean, color=BLACK, linewidth=2.5, label="mean over ranks")
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    together = first_below(mean, target)
    if together is not None:
        ax.axvline(together, color=BLACK, linestyle="--",
                   label=f"mean below target: all stop at step {together}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (log scale)")
    ax.legend(fontsize="small", loc="upper right")
    ax.set_title("Who decides to stop when: on its own loss, or on the mean over ranks",
                 fontsize="medium")
    return fig


def plot_reads(reads: list[float], truth: float, title: str):
    """One bar per rank: the value the rank read, beside a line at the true value (the
    all-reduced result that every rank should have read)."""
    from course_lib.plots.style import BLACK, HIGHLIGHT, new_figure, rank_bar_style

    fig = new_figure(5.5, 2.8)
    ax = fig.subplots()
    for rank, value in enumerate(reads):
        style = rank_bar_style(rank)
        if abs(value - truth) > 1e-6 * max(1.0, abs(truth)):
            style = {**style, "color": HIGHLIGHT}
        ax.bar(rank, value, **style)
        ax.text(rank, value, f"{value:g}", ha="center", va="bottom", fontsize="small")
    ax.axhline(truth, color=BLACK, linestyle="--", label=f"true mean over ranks: {truth:g}")
    ax.set_xticks(range(len(reads)), [f"rank {r}" for r in range(len(reads))])
    ax.set_ylabel("value the rank read")
    ax.set_ylim(0, max(max(reads), truth) * 1.35)
    ax.legend(fontsize="small", loc="upper left")
    ax.set_title(title, fontsize="medium")
    return fig


def collectives_issued() -> int:
    """How many collectives this rank has issued on the default group so far, read from
    PyTorch's flight recorder (on by default in 2.13, 2000 entries; TORCH_FR_BUFFER_SIZE=0
    turns it off: FlightRecorder.hpp). Call it on a rank."""
    import pickle

    import torch

    status = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["pg_status"]
    return max((s["last_enqueued_collective"] for s in status.values()), default=0)


def plot_step_costs(collectives_per_step: dict[str, float], steps: dict[str, list[int]]):
    """One bar per approach: collectives issued per training step (counted from the flight
    recorder, the same in every run), labelled with the steps each rank trained. No time
    per step: on a tiny model its order changed from run to run (3 orders in 4 repeats)."""
    from course_lib.plots.charts import bar_style
    from course_lib.plots.style import new_figure

    names = list(collectives_per_step)
    fig = new_figure(8, 0.6 * len(names) + 1.4)
    ax = fig.subplots()
    for i, name in enumerate(names):
        ax.barh(i, collectives_per_step[name], **bar_style(i))
        taken = ", ".join(str(n) for n in steps[name])
        ax.text(collectives_per_step[name], i,
                f" {collectives_per_step[name]:.2f} (steps per rank: {taken})",
                va="center", fontsize="small")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(collectives_per_step.values()) * 1.8)
    ax.set_xlabel("collectives per training step (flight recorder)")
    ax.set_title("What ending uneven inputs together costs each step", fontsize="medium")
    return fig
