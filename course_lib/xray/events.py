"""One job: the schema of every event the probes write and the rules read (a TypedDict
per kind).

Every event has `kind`, `where` (the learner's "file:line", "" when none) and `t`
(time.monotonic() when it was noted); a field a probe adds later, or only in some runs, is
NotRequired. `EVENTS` maps each kind to its schema and to the probe module that writes it
(`record` for the x-ray's own "probe_error"). A rule names the schemas it reads (`needs`)
and reads them typed: `run.of(Pass)` is a list of (rank, Pass). tests/test_xray_probes.py
checks that every record.note in the probes names a kind here, that every kind a rule needs
has a writer, and that a real run's events match their schema (`mismatch`).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from the real
# annotations (with string annotations Python 3.11 counts every field as required).
# typing_extensions (a dependency of torch): typing.NotRequired is Python 3.11+.
from dataclasses import dataclass
from typing import Any

from typing_extensions import NotRequired, TypedDict


class Event(TypedDict):
    kind: str
    where: str
    t: float


class SamplerSettings(TypedDict):
    """A DistributedSampler's settings when a pass over it began."""

    num_replicas: int
    rank: int
    shuffle: bool
    drop_last: bool
    total_size: int
    epoch: int


# -- probes/data.py ------------------------------------------------------------------------


class Loader(Event):
    """A DataLoader was made (noted before its constructor checks the arguments)."""

    key: str  # "file:line#n": the n-th loader made at that line
    shuffle: bool
    sampler: str  # the sampler's class name, "" when none was given
    sampler_key: int


class Pass(Event):
    """One pass over a DataLoader; the batch fields grow while the loop runs."""

    loader: str  # the Loader's key
    number: int  # passes over this loader before this one
    sampler_key: int
    sampler: str
    random: bool
    distributed: SamplerSettings | None
    dataset_len: int | None
    grad: bool
    indices: list[list[Any]]  # per batch, the base dataset's indices
    sizes: list[int]  # per batch the loop took, its rows
    fingerprints: list[list[float]]  # per batch, one number per sample
    backward: int  # backward calls during the pass: > 0 is a training pass
    done: bool  # the loop ran to the loader's end
    base: str  # the base dataset's class, under any Subsets
    end: NotRequired[float]  # when the last batch came (absent: no batch came)
    stopped: NotRequired[float]  # when the loop asked past the last batch (with done)


class Sampler(Event, SamplerSettings):
    """A DistributedSampler was made."""

    key: int
    dataset_len: int | None


class SetEpoch(Event):
    sampler_key: int
    epoch: int


class Join(Event):
    """Join (model.join()) was entered: uneven inputs handled."""

    enable: bool


# -- probes/output.py ----------------------------------------------------------------------


class Print(Event):
    """A print() or a console log record from the learner's code."""

    text: str


# -- probes/collectives.py -----------------------------------------------------------------


class Collective(Event):
    """A collective the learner's code called itself."""

    op: str  # its name in torch.distributed
    shapes: list[list[int]]
    group: int  # the group's size (0: unknown)


class DdpBufferSync(Event):
    """DDP's buffer broadcast before a forward, and that forward's modes."""

    grad: bool
    training: bool


# -- probes/ddp.py -------------------------------------------------------------------------


class Ddp(Event):
    """A model was wrapped in DistributedDataParallel."""

    find_unused: bool
    static_graph: bool
    params: int
    batchnorm: list[str]
    sync_batchnorm: list[str]


class DdpUnused(Event):
    """A synced DDP backward left parameters without a gradient (noted once)."""

    names: list[str]
    count: int
    of: int


class BatchNorm(Event):
    """A plain BatchNorm layer's largest training batch so far."""

    layer: str
    cls: str
    batch: int
    layer_id: int


# -- probes/optim.py -----------------------------------------------------------------------


class OptStep(Event):
    """One optimizer step, with the DDP backwards since the last one (ddp.take_counts)."""

    step: int
    opt: str  # "SGD#1": the same on every rank that makes optimizers in the same order
    synced: int  # backwards that all-reduced
    local: int  # backwards inside no_sync()
    all_used: int  # synced backwards in which every parameter got a gradient
    no_sync: int  # no_sync() entries
    accumulated: int  # synced backwards since zero_grad()
    forward_at: NotRequired[str]  # the line of the first synced forward
    skipped: NotRequired[bool]  # a GradScaler step that found inf/NaN
    # At sampled steps, with plain (comparable) parameters: per parameter [sum, sum of squares]
    grads: NotRequired[list[list[float]]]
    params: NotRequired[list[list[float]]]
    params_before: NotRequired[list[list[float]]]  # step 1 only
    shapes: NotRequired[str]
    # While fp16 trains: gradient values exactly 0.0, of how many, the largest |value|
    zero: NotRequired[int]
    values: NotRequired[int]
    max_abs: NotRequired[float]


class Fp16Params(Event):
    """An optimizer stepped fp16 parameters (model.half())."""

    count: int


# -- probes/amp.py -------------------------------------------------------------------------


class Autocast(Event):
    """An enabled autocast was entered (once per device, dtype and grad mode)."""

    device: str
    dtype: str
    training: bool


class ScalerScale(Event):
    """An enabled GradScaler scaled a loss (noted once per scaler)."""


# -- probes/checkpoint.py ------------------------------------------------------------------


class SyncPoints(TypedDict):
    """How far the rank was in the sequences that order ranks (collectives, DDP steps)."""

    collectives: int
    ddp_forwards: int
    ddp_backwards: int


class Save(Event):
    """torch.save of a file by the learner's code; the rest is added when it returns."""

    path: str
    prefixed: int  # keys starting with "module."
    keys: int
    t_end: NotRequired[float]
    size: NotRequired[int]
    collectives: NotRequired[int]
    ddp_forwards: NotRequired[int]
    ddp_backwards: NotRequired[int]


class Load(Event, SyncPoints):
    """torch.load of a file by the learner's code."""

    path: str
    size: int  # the file's size when the load began, -1: no file
    t_end: NotRequired[float]
    error: NotRequired[str]


class LoadStateDict(Event):
    """Module.load_state_dict called by the learner's code, and its outcome."""

    module: str
    wrapper: bool  # into the DDP wrapper
    prefixed: int
    keys: int
    strict: bool
    error: NotRequired[str]
    missing: NotRequired[int]
    unexpected: NotRequired[int]


# -- probes/process.py ---------------------------------------------------------------------


class Spawn(Event):
    """The script called mp.spawn / start_processes (the x-ray refuses nprocs > 0)."""

    nprocs: int
    fn: str


class Exit(Event):
    """The script raised SystemExit (sys.exit(), exit(), argparse); `where` is the learner's
    line it came from."""

    code: str  # repr of SystemExit.code: "None", "0", "2", "'need 2 GPUs'"
    library: str  # the module that raised it when not the learner's code ("argparse"), else ""


# -- probes/gpu.py -------------------------------------------------------------------------


class GpuQuery(Event):
    """The learner's code asked how many GPUs there are, or whether there is one."""

    call: str  # "torch.cuda.device_count()"
    result: str  # repr of what it returned: "0", "False", "None"


class InitProcessGroup(Event):
    """The learner's code asked for a process group (the launch's group serves it)."""

    backend: str  # "nccl", "gloo", "" when not named
    world_size: int  # -1 when not given


# -- probes/tensor_parallel.py -------------------------------------------------------------


class TpPlan(Event):
    """parallelize_module was called by the learner's code (the outermost call)."""

    key: str  # "file:line#n": the n-th call at that line, the same on every rank
    group: list[int]  # the global ranks of the mesh it was given: this rank's TP group
    dim: str  # that mesh's dimension name ("tp"), "" when unnamed
    mesh_shape: list[int]  # the whole mesh it was cut from ([2, 2] for a 2-D mesh)
    mesh_dims: list[str]  # the whole mesh's dimension names (["dp", "tp"]), [] when unnamed
    plan: list[str]  # the plan's keys (the first few), or the style's class name
    module: str  # the parallelized module's class


class TpInput(Event):
    """What this rank fed a parallelized module in one of its first forwards."""

    plan: str  # the TpPlan's key
    number: int  # forwards in this grad mode before this one
    grad: bool
    data: bool  # the input came from outside the model (no autograd history)
    rows: int
    fingerprint: list[float]  # one number per sample (the first MAX_ROWS); [] for a DTensor
    layout: str  # a DTensor input's placements ("(Shard(dim=0),)"), "" for a local tensor


class Seed(Event):
    """torch.manual_seed(value) was called (the first few calls)."""

    value: int


class TpDropout(Event):
    """A dropout in training, after a module was parallelized on this rank: its input and
    the random generator's state it drew the mask from (the first calls at each line)."""

    number: int  # calls at this line before this one
    p: float
    fingerprint: list[float]  # the input, one number per sample (the first MAX_ROWS)
    rng: int  # a checksum of the generator's state


# -- probes/pipeline.py --------------------------------------------------------------------


class PipelineSchedule(Event):
    """A pipeline schedule was made (ScheduleGPipe, Schedule1F1B, ...)."""

    key: int  # schedules made on this rank before it, plus one: the same on every rank
    schedule: str  # its class
    n_microbatches: int
    scale_grads: bool
    loss: str  # the loss function's name, "" without one
    reduction: str  # "mean", "sum", "none"; "" when the loss function does not say


class PipelineStep(Event):
    """One step() of a pipeline schedule on this rank (the first few, and later ones whose
    batch size changed); `losses` is filled in when step() returns."""

    schedule: int  # the PipelineSchedule's key
    number: int  # steps of this schedule before this one
    stages: int  # the pipeline's number of stages
    stage: int  # this rank's (first) stage index
    last: bool  # this rank holds the last stage
    rows: int  # the batch size of the first positional input, -1 without one
    losses_given: bool  # a `losses` list was passed
    losses: NotRequired[int]  # its length after step() returned


# -- record.py -----------------------------------------------------------------------------


class ProbeError(Event):
    """A probe's own bookkeeping failed (record.guard), or it could not be installed on
    this torch (`installing`); `probe` names its module."""

    error: str
    probe: str
    installing: bool


@dataclass(frozen=True)
class Kind:
    """An event kind: its schema and the probe module that writes it."""

    schema: type[Event]
    writer: str  # a module of course_lib/xray/probes/, or "record"


EVENTS: dict[str, Kind] = {
    "loader": Kind(Loader, "data"), "pass": Kind(Pass, "data"),
    "sampler": Kind(Sampler, "data"), "set_epoch": Kind(SetEpoch, "data"),
    "join": Kind(Join, "data"), "print": Kind(Print, "output"),
    "collective": Kind(Collective, "collectives"),
    "ddp_buffer_sync": Kind(DdpBufferSync, "collectives"),
    "ddp": Kind(Ddp, "ddp"), "ddp_unused": Kind(DdpUnused, "ddp"),
    "batchnorm": Kind(BatchNorm, "ddp"), "opt_step": Kind(OptStep, "optim"),
    "fp16_params": Kind(Fp16Params, "optim"), "autocast": Kind(Autocast, "amp"),
    "scaler_scale": Kind(ScalerScale, "amp"), "save": Kind(Save, "checkpoint"),
    "load": Kind(Load, "checkpoint"), "load_state_dict": Kind(LoadStateDict, "checkpoint"),
    "spawn": Kind(Spawn, "process"), "exit": Kind(Exit, "process"),
    "gpu_query": Kind(GpuQuery, "gpu"), "init_process_group": Kind(InitProcessGroup, "gpu"),
    "tp_plan": Kind(TpPlan, "tensor_parallel"), "tp_input": Kind(TpInput, "tensor_parallel"),
    "seed": Kind(Seed, "tensor_parallel"), "tp_dropout": Kind(TpDropout, "tensor_parallel"),
    "pipeline_schedule": Kind(PipelineSchedule, "pipeline"),
    "pipeline_step": Kind(PipelineStep, "pipeline"),
    "probe_error": Kind(ProbeError, "record"),
}
KIND_OF: dict[type[Event], str] = {kind.schema: name for name, kind in EVENTS.items()}


def mismatch(event: Any) -> str:
    """"" when the event matches its kind's schema, else what is wrong (an unknown kind, a
    required field missing, a field the schema does not name)."""
    kind = EVENTS.get(event.get("kind", ""))
    if kind is None:
        return f"unknown event kind {event.get('kind')!r}"
    required: frozenset[str] = getattr(kind.schema, "__required_keys__")  # noqa: B009
    optional: frozenset[str] = getattr(kind.schema, "__optional_keys__")  # noqa: B009
    missing = sorted(required - set(event))
    extra = sorted(set(event) - required - optional)
    if missing or extra:
        return f"{event['kind']}: missing {missing}, not in the schema {extra}"
    return ""
