"""A simulated interconnect for DDP on one machine, and the scaling model it obeys.

    model.register_comm_hook(PRESETS["10 GbE"], simulated_link)   # DDP's average, on a link
    model.register_comm_hook(OnLink(link, powerSGD_hook, state), hook_on_link)  # any hook
    predict_step(compute_s, nbytes, world_size, link)   # the same model, on paper
    crossover(compute_s, nbytes, link)                  # where communication dominates
    network_interfaces()                                # which interface gloo would use

A ring all-reduce on N ranks takes 2(N-1) steps (N-1 of reduce-scatter, N-1 of all-gather);
each step pays the link's latency and carries 1/N of the buffer, so each all-reduce costs
2(N-1) x latency + 2(N-1)/N x bytes / bandwidth (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", 2005). Each rank has one
queue per link: a transfer starts when the previous one has left the link. The real
all-reduce still runs on loopback, so results are exactly those of DDP without the hook; the
link's time is added AFTER it, so a step on the link is the step on loopback plus the link's
time (on a shared CPU the loopback all-reduce is not free: it waits for ranks the OS parked).

No `from __future__ import annotations`: DDP checks a comm hook's annotations at runtime.
"""

import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

MB = 1e6
_REAL_ALL_REDUCE = dist.all_reduce  # the course's own all-reduces never go through a patch


@dataclass(frozen=True)
class Link:
    """A link between ranks: `gbit_per_s` each way, `latency_ms` per message (per ring step)."""

    gbit_per_s: float
    latency_ms: float = 0.5
    name: str = ""  # part of equality: two named links are two queues, two traffic counts

    def __post_init__(self) -> None:
        if self.gbit_per_s <= 0 or self.latency_ms < 0:
            raise ValueError(f"{type(self).__name__} needs gbit_per_s > 0 and latency_ms >= 0, "
                             f"got {self.gbit_per_s} and {self.latency_ms}")

    def seconds(self, nbytes: int, world_size: int = 2) -> float:
        """One ring all-reduce of `nbytes` over `world_size` ranks: 2(N-1) latencies plus
        2(N-1)/N of the bytes at the bandwidth (0 for one rank: nothing crosses a link)."""
        if world_size < 2:
            return 0.0
        steps = 2 * (world_size - 1)
        return (steps * self.latency_ms / 1e3
                + steps / world_size * nbytes * 8 / (self.gbit_per_s * 1e9))

    def label(self) -> str:
        return self.name or f"{self.gbit_per_s:g} Gbit/s, {self.latency_ms:g} ms"


# Bandwidth: one direction, from the published specification. Latency: a typical
# figure for a small message through NCCL or TCP, an order of magnitude to teach with (no
# vendor publishes it as a spec; measure yours with nccl-tests' all_reduce_perf).
PRESETS = {
    # NVIDIA H100 datasheet: "NVLink: 900GB/s" (both directions) -> 450 GB/s each way.
    "NVLink 4 (H100)": Link(3600, 0.003, "NVLink 4 (H100)"),
    # PCI-SIG PCIe 4.0: 16 GT/s a lane, 128b/130b, x16 -> 31.5 GB/s each way.
    "PCIe 4.0 x16": Link(252, 0.005, "PCIe 4.0 x16"),
    # IEEE 802.3ba (100 GbE) and 802.3ae (10 GbE): line rate each way; TCP latency.
    "100 GbE": Link(100, 0.02, "100 GbE"),
    "10 GbE": Link(10, 0.05, "10 GbE"),
    # IEEE 802.3ab (1000BASE-T): an office network or a cheap cloud instance.
    "1 GbE": Link(1, 0.1, "1 GbE"),
}


class _LinkQueue:
    """One rank's queue on one link: each transfer's Future completes when the real
    all-reduce is done and the modelled link has then carried it. Each waits on its own
    thread, so that a hook's callback may issue and wait for the next all-reduce (PowerSGD)."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.calls = 0
        self.bytes = 0
        self.lock = threading.Lock()

    def send(self, seconds: float, nbytes: int, real: torch.futures.Future
             ) -> torch.futures.Future:
        """A Future with `real`'s value, completed `seconds` after both `real` and the
        previous transfer on this link are done."""
        self.calls += 1
        self.bytes += nbytes
        out: torch.futures.Future = torch.futures.Future()
        threading.Thread(target=self._deliver, args=(seconds, real, out), daemon=True,
                         name="simulated-link").start()
        return out

    def _deliver(self, seconds: float, real: torch.futures.Future,
                 out: torch.futures.Future) -> None:
        """Complete `out` with `real`'s value once the link has carried it, or with its error."""
        try:
            value = real.wait()
        except RuntimeError as err:  # the real all-reduce failed (gloo): pass its error on
            out.set_exception(err)
            return
        with self.lock:
            done_at = max(time.perf_counter(), self.free_at) + seconds
            self.free_at = done_at
        time.sleep(max(0.0, done_at - time.perf_counter()))
        out.set_result(value)


_QUEUES: dict[Link, _LinkQueue] = {}
_LOCK = threading.Lock()


def _queue(link: Link) -> _LinkQueue:
    with _LOCK:
        if link not in _QUEUES:
            _QUEUES[link] = _LinkQueue()
        return _QUEUES[link]


def _on_link(link: Link, tensor: torch.Tensor, real: torch.futures.Future
             ) -> torch.futures.Future:
    nbytes = tensor.numel() * tensor.element_size()
    return _queue(link).send(link.seconds(nbytes, dist.get_world_size()), nbytes, real)


def simulated_link(link: "Link | None",
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook: DDP's own average (divide by the world size, all-reduce), delivered
    when `link` would have carried the bucket (None: no link, as fast as loopback)."""
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    real = _REAL_ALL_REDUCE(tensor, async_op=True).get_future().then(_first)
    return real if link is None else _on_link(link, tensor, real)


def _first(fut: torch.futures.Future) -> torch.Tensor:
    """The bucket a comm hook's Future must hold (the all-reduce's holds a list of it)."""
    return fut.value()[0]


def traffic(link: Link) -> dict[str, float]:
    """What this rank sent on `link` so far: all-reduces and megabytes (before the ring)."""
    q = _QUEUES.get(link)
    return {"calls": q.calls if q else 0, "mb": (q.bytes if q else 0) / MB}


# -- any comm hook on the link: PowerSGD, fp16 compression ------------------------------------

@dataclass
class OnLink:
    """State for hook_on_link: run `hook(state, bucket)` with its all-reduces on `link`."""

    link: "Link | None"
    hook: Callable
    state: Any = None


class _DelayedWork:
    """What dist.all_reduce(async_op=True) returns, its Future delayed by the link."""

    def __init__(self, future: torch.futures.Future) -> None:
        self._future = future

    def get_future(self) -> torch.futures.Future:
        return self._future

    def wait(self, timeout: Any = None) -> bool:
        self._future.wait()
        return True


_ROUTE: dict[str, Link] = {}


def _all_reduce_on_link(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                        async_op: bool = False) -> Any:
    work = _REAL_ALL_REDUCE(tensor, op=op, group=group, async_op=True)
    delayed = _on_link(_ROUTE["link"], tensor, work.get_future())
    if async_op:
        return _DelayedWork(delayed)
    delayed.wait()
    return None


def hook_on_link(on: OnLink, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that runs `on.hook` (fp16_compress_hook, powerSGD_hook...) with every
    dist.all_reduce of this rank on `on.link`: the link carries what the hook really sends.
    It replaces torch.distributed.all_reduce in this process until a hook_on_link with no
    link runs (PowerSGD all-reduces again from a callback, after the hook has returned).
    simulated_link is not affected: it calls the real all-reduce."""
    if on.link is None:
        dist.all_reduce = _REAL_ALL_REDUCE
    else:
        _ROUTE["link"] = on.link
        dist.all_reduce = _all_reduce_on_link
    return on.hook(on.state, bucket)


# -- the model on paper -----------------------------------------------------------------------

def predict_step(compute_s: float, nbytes: int, world_size: int, link: Link,
                 calls: int = 1) -> float:
    """Seconds per step: compute (the step on loopback), then `calls` all-reduces sharing
    `nbytes` on `link`, with no overlap (one bucket: it starts when the backward ends)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    return compute_s + calls * link.seconds(nbytes / calls, world_size)


def efficiency(compute_s: float, step_s: float) -> float:
    """Weak-scaling efficiency: the share of a step spent computing (1.0: N ranks, N x)."""
    return compute_s / step_s


def crossover(compute_s: float, nbytes: int, link: Link, max_world: int = 64) -> int | None:
    """The smallest world size at which one all-reduce of `nbytes` on `link` takes at least
    the compute (efficiency <= 50%: communication dominates), None up to `max_world`."""
    return next((n for n in range(2, max_world + 1) if link.seconds(nbytes, n) >= compute_s),
                None)


# -- which interface a backend would use ------------------------------------------------------

def network_interfaces() -> list[dict[str, str]]:
    """This machine's interfaces with their IPv4 address, and which one gloo would bind to:
    GLOO_SOCKET_IFNAME's if set, otherwise the one holding the hostname's address."""
    import os

    import psutil

    rows = []
    for name, addrs in psutil.net_if_addrs().items():
        ipv4 = next((a.address for a in addrs if a.family == socket.AF_INET), "")
        rows.append({"interface": name, "ipv4": ipv4})
    chosen = os.environ.get("GLOO_SOCKET_IFNAME", "")
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        host_ip = ""
    for row in rows:
        by_env = row["interface"] == chosen
        by_host = not chosen and row["ipv4"] == host_ip
        row["gloo"] = ("<- GLOO_SOCKET_IFNAME" if by_env else
                       f"<- hostname {socket.gethostname()} resolves here" if by_host else "")
    return rows


# -- pictures ---------------------------------------------------------------------------------

# Links that join the GPUs of one node only: an HGX H100 node has 8 GPUs on NVLink 4, and an
# all-reduce over more ranks crosses the network between nodes, so its line stops there.
ONE_NODE = {"NVLink 4 (H100)": 8}


def plot_scaling(models: dict[str, tuple[float, int]], links: dict[str, Link],
                 measured: dict[int, tuple[float, float, float]] | None = None,
                 sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64), title: str = ""):
    """Predicted weak-scaling efficiency against world size, one panel per model of `models`
    {name: (compute seconds, gradient bytes)}, one line per link (a link of ONE_NODE stops
    at its node's size), each line's crossover (communication = compute) starred. `measured`
    {world size: (one rank's step, step on the simulated link, predicted step)} from real
    ranks is drawn on the first panel."""
    from course_lib.plots.style import HIGHLIGHT, LINESTYLES, MARKERS, RANK_COLORS, new_figure

    fig = new_figure(8.4, 6.2)
    axes = fig.subplots(1, len(models), sharey=True)
    top = 1.05
    for ax, (model, (compute_s, nbytes)) in zip(axes, models.items()):
        for i, (name, link) in enumerate(links.items()):
            most = ONE_NODE.get(name, sizes[-1])
            _scaling_line(ax, compute_s, nbytes, name, link,
                          tuple(n for n in sizes if n <= most),
                          RANK_COLORS[i % len(RANK_COLORS)], MARKERS[i % len(MARKERS)],
                          LINESTYLES[i % len(LINESTYLES)])
        if measured and ax is axes[0]:
            top = max(1.05, *(0.05 + efficiency(m[0], m[1]) for m in measured.values()))
            _measured_points(ax, measured, HIGHLIGHT)
        ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.text(sizes[-1], 0.52, "communication\n= compute", ha="right", fontsize="small")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, *sizes], [str(n) for n in (1, *sizes)])
        ax.minorticks_off()
        ax.set_ylim(0, top)
        ax.set_xlabel("world size (ranks)")
        ax.set_title(f"{model}: {nbytes / MB:.1f} MB of gradients,\n"
                     f"{compute_s * 1e3:.1f} ms compute a step (this CPU)", fontsize="small")
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    axes[0].set_ylabel("efficiency = one rank's step / step")
    fig.suptitle(title or "Predicted weak-scaling efficiency with this CPU's compute (star: "
                 "communication starts to dominate;\na GPU's shorter compute moves every star "
                 "to the left)", fontsize="medium")
    return fig


def _scaling_line(ax: Any, compute_s: float, nbytes: int, name: str, link: Link,
                  sizes: tuple[int, ...], color: str, marker: str, style: Any) -> None:
    eff = [efficiency(compute_s, predict_step(compute_s, nbytes, n, link)) for n in sizes]
    at = crossover(compute_s, nbytes, link, sizes[-1])
    where = f"never dominates up to {sizes[-1]}" if at is None else f"dominates from {at}"
    ax.plot(sizes, eff, color=color, marker=marker, linestyle=style, ms=4,
            label=f"{name} ({where})")
    if at is not None:
        at_eff = efficiency(compute_s, predict_step(compute_s, nbytes, at, link))
        ax.plot([at], [at_eff], marker="*", ms=15, color=color, mec="black", zorder=5)


def _measured_points(ax: Any, measured: dict[int, tuple[float, float, float]],
                     color: str) -> None:
    ns = sorted(measured)
    ax.plot(ns, [efficiency(measured[n][0], measured[n][1]) for n in ns], "o", ms=10,
            color=color, fillstyle="none", mew=2,
            label="real ranks here on SIMULATED 1 GbE")
    ax.plot(ns, [efficiency(measured[n][0], measured[n][2]) for n in ns], "x--", ms=8,
            lw=0.8, color="black", label="predicted for those runs")


def plot_bucket_sweep(sweep: dict[float, dict[str, Any]], link: Link, loopback_ms: float):
    """Step time against bucket_cap_mb: `sweep` {cap: {"ms": [step ms per repeat],
    "buckets": all-reduces a step}}, each repeat (one pass over the sizes) a thin line, the
    median bold, the mechanism that costs time at each end labelled, and the step without
    the link for reference."""
    from course_lib.plots.style import HIGHLIGHT, RANK_COLORS, new_figure

    caps = sorted(sweep)
    fig = new_figure(8, 3.8)
    ax = fig.subplots()
    for r in range(len(sweep[caps[0]]["ms"])):
        ax.plot(caps, [sweep[c]["ms"][r] for c in caps], color="grey", lw=0.8, alpha=0.6,
                marker=".", label="each repeat (one pass over the sizes)" if r == 0 else None)
    mid = [statistics.median(sweep[c]["ms"]) for c in caps]
    ax.plot(caps, mid, marker="o", lw=2.2, color=RANK_COLORS[0],
            label=f"median, on simulated {link.label()}")
    for cap, m in zip(caps, mid):
        n = sweep[cap]["buckets"]
        last = cap == caps[-1]
        ax.annotate(f"{n:g} bucket{'' if n == 1 else 's'}", (cap, m), textcoords="offset points",
                    xytext=(-6 if last else 6, -14), ha="right" if last else "left",
                    fontsize="small")
    ax.axhline(loopback_ms, color="black", ls=":", lw=1, label="same step without the link")
    top = max(max(sweep[c]["ms"]) for c in caps)
    ax.text(caps[0], top * 1.17, "many buckets:\neach pays 2(N-1) latencies", ha="left",
            va="top", fontsize="small", color=HIGHLIGHT)
    ax.text(caps[-1], top * 1.17, "one bucket: the link starts\nonly when backward ends",
            ha="right", va="top", fontsize="small", color=HIGHLIGHT)
    ax.set_xscale("log")
    ax.set_xticks(caps, [f"{c:g}" for c in caps])
    ax.minorticks_off()
    ax.set_ylim(0, top * 1.2)
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("ms per step")
    ax.set_title("Bucket size on a slow, high-latency link: latency x buckets against overlap",
                 fontsize="medium")
    ax.legend(fontsize="small", loc="lower center")
    return fig


def plot_bars(values: dict[str, float], ylabel: str, title: str, fmt: str = "{:.1f}"):
    """One bar per run (a bucket size, a hook), labelled with its value."""
    from course_lib.plots.style import HATCHES, RANK_COLORS, new_figure

    fig = new_figure(6.5, 3.0)
    ax = fig.subplots()
    bars = ax.bar(range(len(values)), list(values.values()), edgecolor="black",
                  color=[RANK_COLORS[i % len(RANK_COLORS)] for i in range(len(values))])
    for bar, hatch in zip(bars, HATCHES * 3):
        bar.set_hatch(hatch)
    ax.bar_label(bars, [fmt.format(v) for v in values.values()], fontsize="small")
    ax.set_xticks(range(len(values)), list(values), fontsize="small")
    ax.set_ylim(0, max(values.values()) * 1.25 or 1)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize="medium")
    return fig


def plot_losses(curves: dict[str, list[float]], title: str):
    """Training loss per step, one line per run."""
    from course_lib.plots.style import LINESTYLES, MARKERS, RANK_COLORS, new_figure, step_axis

    fig = new_figure(7, 3.2)
    ax = fig.subplots()
    for i, (name, values) in enumerate(curves.items()):
        ax.plot(values, label=name, color=RANK_COLORS[i], linestyle=LINESTYLES[i],
                marker=MARKERS[i], markersize=3, fillstyle="none")
    step_axis(ax)
    ax.set_ylabel("training loss (rank 0)")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    return fig


def scaling_explorer(seconds_per_param: float, sizes_m: tuple[float, ...] = (1, 10, 100, 1000)):
    """Sliders: world size, model size (millions of fp32 parameters), link -> predicted step
    time and efficiency, compute calibrated at `seconds_per_param` (measured here)."""
    import ipywidgets as widgets

    world = widgets.SelectionSlider(options=[2, 4, 8, 16, 32, 64], value=8,
                                    description="world size")
    params = widgets.SelectionSlider(options=list(sizes_m), value=sizes_m[1],
                                     description="M params")
    link = widgets.Dropdown(options=list(PRESETS), value="10 GbE", description="link")
    out = widgets.HTML()

    def redraw(_: object = None) -> None:
        n_params = params.value * 1e6
        compute = seconds_per_param * n_params
        step = predict_step(compute, int(4 * n_params), world.value, PRESETS[link.value])
        out.value = (f"compute {compute * 1e3:.1f} ms + all-reduce "
                     f"{(step - compute) * 1e3:.1f} ms = <b>{step * 1e3:.1f} ms</b> a step; "
                     f"efficiency <b>{efficiency(compute, step):.0%}</b>")

    for w in (world, params, link):
        w.observe(redraw, "value")
    redraw()
    return widgets.VBox([widgets.HBox([world, params, link]), out])
