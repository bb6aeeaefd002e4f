"""Lesson 13's accounting of per-rank training memory: the bytes of the tensors a rank holds
(parameters, gradients, optimizer state, saved activations, parameters gathered by FSDP),
the textbook prediction of the same bytes, and their pictures and calculator."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

MiB = 2**20
PARTS = ("parameters", "gradients", "optimizer state", "gathered parameters", "activations")
STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "FSDP2")
# Bytes per parameter, by how training stores it: (the stored parameter, its gradient, extra
# optimizer state beside the moments, the parameter as the forward computes with it).
# PyTorch keeps fp32 parameters, gradients and Adam state under bf16: autocast casts each
# weight to bf16 in the forward and keeps the casts for backward; FSDP2's MixedPrecisionPolicy
# gathers bf16 units from fp32 shards (_fsdp_api.py: "FSDP ... keeps the high-precision sharded
# parameters in memory anyway"). The ZeRO paper's 2+2+12 (bf16 weights and gradients, an fp32
# master copy) is DeepSpeed's bookkeeping, not what a PyTorch wrapper stores.
PRECISIONS = {"fp32": (4, 4, 0, 4), "bf16 PyTorch": (4, 4, 0, 2),
              "bf16 DeepSpeed": (2, 2, 4, 2)}
OPTIMIZERS = {"SGD": 0, "SGD + momentum": 4, "Adam": 8}


def nbytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: its local shard for a DTensor, else the tensor itself."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def rss() -> int:
    """This process's resident set size now, in bytes (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The state this rank's optimizer holds: ZeroRedundancyOptimizer keeps its own shard's
    in `.optim`."""
    return getattr(optimizer, "optim", optimizer).state


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage behind `t`'s bytes on this rank (a DTensor's local shard)."""
    return (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()


def _module_params(model: nn.Module) -> list[torch.Tensor]:
    """The parameters the modules hold right now: FSDP2 swaps in the gathered (unsharded)
    tensors during a unit's forward and backward, and the shards back afterwards."""
    return [p for m in model.modules() for p in m._parameters.values() if p is not None]


class Meter:
    """Counts, on one rank, the bytes of each kind of tensor training holds. Make it before
    the model (it reads the RSS then), run forward passes inside `meter.forward(model)`, and
    call `meter.measure(model, optimizer)` after `optimizer.step()`, before `zero_grad()`."""

    def __init__(self) -> None:
        self.rss_start = rss()
        self.activations = 0
        self.gathered = 0
        self.unsharded_grads = 0  # peak bytes of full-size gradients beside the shards
        self.trace: list[tuple[str, int]] = []  # (phase, gathered bytes), the last step
        self.counts: dict[str, int] = {}

    def _gathered_now(self, model: nn.Module, own: set[int]) -> int:
        """Bytes of parameters held in full beyond the rank's own ones (FSDP2's all-gathers)."""
        storages = {_storage(p).data_ptr(): _storage(p).nbytes()
                    for p in _module_params(model) if id(p) not in own}
        return sum(storages.values())

    def _unsharded_grads_now(self, model: nn.Module, own: set[int]) -> int:
        """Bytes of full-size gradients of gathered parameters: FSDP2 holds a unit's until
        its reduce-scatter (_fsdp_param_group.py, post_backward)."""
        return sum(nbytes(p.grad) for p in _module_params(model)
                   if id(p) not in own and p.grad is not None)

    @contextlib.contextmanager
    def forward(self, model: nn.Module) -> Iterator[None]:
        """Count what autograd saves for backward (not parameters), and sample the gathered
        parameter bytes at each save and at each use in backward."""
        own = {id(p) for p in model.parameters()}
        saved: dict[int, int] = {}
        self.activations = 0
        self.trace = []

        def sample(phase: str) -> None:
            now = self._gathered_now(model, own)
            self.trace.append((phase, now))
            self.gathered = max(self.gathered, now)
            self.unsharded_grads = max(self.unsharded_grads, self._unsharded_grads_now(model, own))

        def pack(t: torch.Tensor) -> Any:
            sample("forward")
            weights = {_storage(p).data_ptr() for p in _module_params(model)}
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights and ptr not in saved:
                saved[ptr] = t.untyped_storage().nbytes()
                self.activations = sum(saved.values())
            return t

        def unpack(t: torch.Tensor) -> torch.Tensor:
            sample("backward")
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield

    def measure(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """This rank's bytes per part (and RSS growth since the meter was made)."""
        params = list(model.parameters())
        state = optimizer_state(optimizer)
        self.counts = {
            "parameters": sum(nbytes(p) for p in params),
            "gradients": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer state": sum(nbytes(v) for s in state.values() for v in s.values()
                                   if torch.is_tensor(v)),
            "activations": self.activations,
            "gathered parameters": self.gathered,
            "unsharded gradients": self.unsharded_grads,
            "rss growth": rss() - self.rss_start,
        }
        return self.counts


# -- the textbook prediction -------------------------------------------------------------------

def predict(n_params: int, world_size: int, strategy: str, precision: str = "fp32",
            optimizer: str = "Adam", unit_params: int = 0,
            bucket_view: bool = False) -> dict[str, float]:
    """Bytes per rank for parameters, gradients, optimizer state and the copies of parameters
    the forward computes with ("gathered parameters": FSDP2's largest unit, `unit_params`,
    all-gathered; under DDP and ZeRO, autocast's low-precision casts of every weight).

    DDP and ZeRO-1 also hold their gradient buckets, a second copy of the gradients, unless
    the model was wrapped with `gradient_as_bucket_view=True` (`bucket_view`)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if precision not in PRECISIONS or optimizer not in OPTIMIZERS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)} and optimizer one of "
                         f"{list(OPTIMIZERS)}, got {precision!r} and {optimizer!r}")
    if n_params <= 0 or world_size <= 0:
        raise ValueError("n_params and world_size must be positive")
    p, g, master, compute = PRECISIONS[precision]
    n = world_size
    shard = {"DDP": (1, 1, 1), "ZeRO-1": (1, 1, n), "ZeRO-2": (1, n, n), "FSDP2": (n, n, n)}
    sp, sg, so = shard[strategy]
    buckets = g * n_params if strategy in ("DDP", "ZeRO-1") and not bucket_view else 0
    if strategy == "FSDP2":
        copies = compute * unit_params
    else:
        copies = compute * n_params if compute != p else 0
    return {"parameters": p * n_params / sp, "gradients": g * n_params / sg + buckets,
            "optimizer state": (master + OPTIMIZERS[optimizer]) * n_params / so,
            "gathered parameters": float(copies)}


def device_bytes(counts: dict[str, int], offloaded: bool) -> int:
    """What FSDP leaves on the device at the peak: the sharded parameters, gradients and
    optimizer state unless CPUOffloadPolicy moved them to the CPU, plus the peaks of gathered
    parameters and of their full-size gradients (a lower bound: see Meter's sampling)."""
    sharded = 0 if offloaded else sum(counts[k] for k in PARTS[:3])
    return sharded + counts["gathered parameters"] + counts.get("unsharded gradients", 0)


def model_states(counts: dict[str, float]) -> float:
    """Parameters + gradients + optimizer state + gathered parameters: what sharding changes."""
    return sum(counts[k] for k in PARTS if k != "activations")


def comparison(measured: dict[tuple[str, int], list[dict[str, int]]],
               predicted: dict[tuple[str, int], dict[str, float]]) -> tuple[str, float]:
    """A text table of rank 0's measured and predicted MiB per configuration, and the largest
    relative gap over every rank and part (parts predicted as 0 must measure 0)."""
    rows = [f"{'strategy':<22}{'ranks':>5}  {'measured MiB':>14}{'predicted MiB':>15}  gap"]
    worst = 0.0
    for key, ranks in measured.items():
        want = predicted[key]
        for counts in ranks:
            for part, value in want.items():
                gap = abs(counts[part] - value) / value if value else float(counts[part] != 0)
                worst = max(worst, gap)
        got, exp = model_states(ranks[0]), model_states(want)
        rows.append(f"{key[0]:<22}{key[1]:>5}  {got / MiB:>14.2f}{exp / MiB:>15.2f}  "
                    f"{abs(got - exp) / exp:.2%}")
    return "\n".join(rows), worst


# -- pictures ----------------------------------------------------------------------------------

def plot_per_rank(measured: dict[tuple[str, int], list[dict[str, int]]],
                  predicted: dict[tuple[str, int], dict[str, float]]):
    """Stacked bars of every rank's measured bytes per part, grouped by configuration, with
    the formula's total (without activations, stacked last) as a black line over each group."""
    from course_lib.plots.style import BLACK, BLUE, GREEN, ORANGE, PURPLE, SKY, new_figure

    colors = dict(zip(PARTS, (BLUE, ORANGE, GREEN, PURPLE, SKY)))
    fig = new_figure(8.2, 4.6)  # no wider than JupyterLab's notebook (about 850 px)
    ax = fig.subplots()
    x, ticks, labels, top = 0.0, [], [], 0.0
    for key, ranks in measured.items():
        start = x
        for counts in ranks:
            bottom = 0.0
            for part in PARTS:
                ax.bar(x, counts[part] / MiB, bottom=bottom, width=0.8, color=colors[part],
                       edgecolor=BLACK, linewidth=0.4, label=part if x == 0 else None)
                bottom += counts[part] / MiB
            top = max(top, bottom)
            x += 1
        total = model_states(predicted[key]) / MiB
        ax.hlines(total, start - 0.45, x - 0.55, color=BLACK, linewidth=2.5,
                  label="formula (no activations)" if start == 0 else None)
        ticks.append((start + x - 1) / 2)
        name = "\n".join(textwrap.wrap(key[0].replace(",", ""), 8))
        labels.append(f"{name}\n{key[1]} ranks")
        x += 0.8
    ax.set_xticks(ticks, labels, fontsize="small")
    ax.set_ylim(0, top * 1.08)
    ax.set_ylabel("MiB held by each rank (one bar per rank)")
    ax.set_title("Where each rank's training memory goes (measured by tensor accounting)",
                 fontsize="medium")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize="small")
    return fig


def plot_gathered(traces: dict[str, list[tuple[str, int]]], budget: float, title: str = ""):
    """Gathered parameter bytes at each moment autograd saved (forward) or used (backward) a
    tensor in one training step, one line per wrapping, with a device budget."""
    from course_lib.plots.charts import series_style
    from course_lib.plots.style import HIGHLIGHT, new_figure

    fig = new_figure(8, 3.6)
    ax = fig.subplots()
    for i, (name, trace) in enumerate(traces.items()):
        ax.step(range(len(trace)), [b / MiB for _, b in trace], where="post", label=name,
                linewidth=2, **series_style(i, markers=False))
    first = next(iter(traces.values()))
    backward = next((k for k, (phase, _) in enumerate(first) if phase == "backward"), len(first))
    ax.axvspan(backward, len(first), color="0.92", zorder=0, label="backward")
    ax.axhline(budget / MiB, color=HIGHLIGHT, linestyle="--", label="device budget")
    ax.set_xlabel("moments of one step: each tensor autograd saves (forward) or uses (backward)")
    ax.set_ylabel("MiB of gathered parameters")
    ax.set_ylim(0, None)
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig
