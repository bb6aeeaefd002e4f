"""The scaling model of DDP on a link, on paper: what a ring all-reduce costs, and what that
does to a step as the world grows (torch-free; teach/simulated_link.py makes real ranks pay
the same cost).

    PRESETS["10 GbE"].seconds(nbytes, world_size)   # one all-reduce on a link
    predict_step(compute_s, nbytes, world_size, link)   # a step: compute, then all-reduce
    crossover(compute_s, nbytes, link)                  # where communication dominates

A ring all-reduce on N ranks takes 2(N-1) steps (N-1 of reduce-scatter, N-1 of all-gather);
each step pays the link's latency and carries 1/N of the buffer, so each all-reduce costs
2(N-1) x latency + 2(N-1)/N x bytes / bandwidth (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", 2005).
"""

from __future__ import annotations

from dataclasses import dataclass

MB = 1e6


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


# Links that join the GPUs of one node only: an HGX H100 node has 8 GPUs on NVLink 4, and an
# all-reduce over more ranks crosses the network between nodes, so its line stops there.
ONE_NODE = {"NVLink 4 (H100)": 8}


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
