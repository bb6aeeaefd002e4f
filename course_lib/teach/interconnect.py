"""A simulated interconnect for DDP on one machine, and the scaling model it obeys.

    model.register_comm_hook(PRESETS["10 GbE"], simulated_link)   # DDP's average, on a link
    model.register_comm_hook(OnLink(link, powerSGD_hook, state), hook_on_link)  # any hook
    predict_step(compute_s, nbytes, world_size, link)   # the same model, on paper
    network_interfaces()                                # which interface gloo would use

Each all-reduce costs, on a ring of N ranks, the link's latency plus 2(N-1)/N of the bytes
at its bandwidth: each rank sends and receives that share in a ring all-reduce (the bandwidth
term of Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations
in MPICH", 2005; their latency term grows with N too, which we leave out). Each rank has one
queue per link: an all-reduce starts when the previous one has left the link. The real
all-reduce still runs on loopback, so results are exactly those of DDP without the hook.

No `from __future__ import annotations`: DDP checks a comm hook's annotations at runtime.
"""

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

MB = 1e6


@dataclass(frozen=True)
class Link:
    """A link between ranks: `gbit_per_s` each way, `latency_ms` per all-reduce."""

    gbit_per_s: float
    latency_ms: float = 0.5
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.gbit_per_s <= 0 or self.latency_ms < 0:
            raise ValueError(f"{type(self).__name__} needs gbit_per_s > 0 and latency_ms >= 0, "
                             f"got {self.gbit_per_s} and {self.latency_ms}")

    def seconds(self, nbytes: int, world_size: int = 2) -> float:
        """One ring all-reduce of `nbytes` over `world_size` ranks: the latency plus
        2(N-1)/N of the bytes at the bandwidth (0 for one rank: nothing crosses a link)."""
        if world_size < 2:
            return 0.0
        ring = 2 * (world_size - 1) / world_size
        return self.latency_ms / 1e3 + ring * nbytes * 8 / (self.gbit_per_s * 1e9)

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
    """One rank's queue on one link: each transfer's Future completes when the modelled link
    has carried it (and the real all-reduce is done). Each waits on its own thread, so that a
    hook's callback may issue and wait for the next all-reduce (PowerSGD does)."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.calls = 0
        self.bytes = 0

    def send(self, seconds: float, nbytes: int, real: torch.futures.Future
             ) -> torch.futures.Future:
        """A Future with `real`'s value, completed no sooner than the link allows."""
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + seconds
        self.calls += 1
        self.bytes += nbytes
        out: torch.futures.Future = torch.futures.Future()
        threading.Thread(target=_deliver, args=(self.free_at, real, out), daemon=True,
                         name="simulated-link").start()
        return out


def _deliver(done_at: float, real: torch.futures.Future, out: torch.futures.Future) -> None:
    """Complete `out` with `real`'s value at `done_at` (perf_counter), or with its error."""
    try:
        value = real.wait()
        time.sleep(max(0.0, done_at - time.perf_counter()))
        out.set_result(value)
    except RuntimeError as err:  # the real all-reduce failed (gloo): pass its error on
        out.set_exception(err)


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
    real = dist.all_reduce(tensor, async_op=True).get_future().then(_first)
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


_REAL_ALL_REDUCE = dist.all_reduce
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
    It replaces torch.distributed.all_reduce in this process (a rank, which ends soon)."""
    if on.link is not None:
        _ROUTE["link"] = on.link
        dist.all_reduce = _all_reduce_on_link
    return on.hook(on.state, bucket)


# -- the model on paper -----------------------------------------------------------------------

def predict_step(compute_s: float, nbytes: int, world_size: int, link: Link,
                 calls: int = 1) -> float:
    """Seconds per step: compute, then `calls` all-reduces sharing `nbytes` on `link`, with
    no overlap (one bucket: the all-reduce starts when the backward ends)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    return compute_s + calls * link.seconds(nbytes / calls, world_size)


def efficiency(compute_s: float, step_s: float) -> float:
    """Weak-scaling efficiency: the share of a step spent computing (1.0: N ranks, N x)."""
    return compute_s / step_s


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

def plot_scaling(compute_s: float, nbytes: int, links: dict[str, Link],
                 measured: dict[int, float] | None = None,
                 predicted: dict[int, float] | None = None,
                 sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64), title: str = ""):
    """Predicted weak-scaling efficiency against world size, one line per link; `measured`
    {world size: step seconds} from real ranks drawn as points beside their `predicted`."""
    from course_lib.plots.style import HIGHLIGHT, LINESTYLES, MARKERS, RANK_COLORS, new_figure

    fig = new_figure(7.5, 3.6)
    ax = fig.subplots()
    for i, (name, link) in enumerate(links.items()):
        eff = [efficiency(compute_s, predict_step(compute_s, nbytes, n, link)) for n in sizes]
        ax.plot(sizes, eff, color=RANK_COLORS[i % len(RANK_COLORS)], marker=MARKERS[i % 4],
                linestyle=LINESTYLES[i % len(LINESTYLES)], label=f"predicted, {name}")
    if measured:
        ns = sorted(measured)
        ax.plot(ns, [efficiency(compute_s, measured[n]) for n in ns], "o", ms=9,
                color=HIGHLIGHT, fillstyle="none", mew=2, label="measured here (real ranks)")
    if predicted:
        ns = sorted(predicted)
        ax.plot(ns, [efficiency(compute_s, predicted[n]) for n in ns], "x", ms=8,
                color="black", label="predicted for those runs")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.text(sizes[-1], 0.52, "communication = compute", ha="right", fontsize="x-small")
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, *sizes], [str(n) for n in (1, *sizes)])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("efficiency (1 = N ranks, N x)")
    ax.set_title(title or "Weak-scaling efficiency: compute / step time", fontsize="medium")
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
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
