"""The pitfall registry: every id a lesson cell may name, one row each: its title, the
lessons that cover it (the curriculum map in docs/design.md; the first is the one to read),
what a learner meets (`kind`, a key of KINDS, and `symptom`, in the learner's own words: the
course map, docs/course-map.md) and, through NOTEBOOKS, the first lesson's notebook.

Nothing of ours and no third-party module is imported here: the author tools, the x-ray and
the checks all read it. A row that names an unknown lesson or kind, or an id twice, fails at
import. New X-ids are added here first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What a learner sees first, the headings of the course map, in its order.
KINDS = {
    "hang": "The job hangs or times out",
    "crash": "The job stops with an error",
    "wrong": "Numbers, weights or output are wrong, or differ between ranks",
    "slow": "Training is slower, or needs more memory, than it should",
    "varies": "Results change from run to run",
}

# Each lesson's notebook, in notebooks/ (a report's "read:" line names it).
NOTEBOOKS = {
    "00": "00_welcome.ipynb", "01": "01_ddp_from_scratch.ipynb",
    "02": "02_setup_checklist.ipynb", "03": "03_data_sharding.ipynb",
    "04": "04_gradient_sync.ipynb", "05": "05_batchnorm_and_buffers.ipynb",
    "06": "06_profiling.ipynb", "07": "07_gradient_accumulation.ipynb",
    "08": "08_communication_scaling.ipynb", "09": "09_mixed_precision.ipynb",
    "10": "10_hangs_and_desync.ipynb", "11": "11_checkpoints.ipynb",
    "12": "12_reproducibility.ipynb", "13": "13_memory_and_sharding.ipynb",
    "14": "14_torchrun.ipynb", "15": "15_case_files.ipynb",
    "16": "16_tensor_parallel.ipynb",
    "17": "17_pipeline_parallel.ipynb",
}


@dataclass(frozen=True)
class Pitfall:
    """One pitfall: `id` as cells name it, a one-line title, the lessons that cover it, and
    what a learner meets: `kind` (a key of KINDS) and `symptom`, in the learner's own words."""

    id: str
    title: str
    lessons: tuple[str, ...]
    kind: str
    symptom: str

    @property
    def notebook(self) -> str:
        """The first lesson's notebook, "notebooks/03_data_sharding.ipynb"."""
        return f"notebooks/{NOTEBOOKS[self.lessons[0]]}"


def _row(pid: str, lessons: str, kind: str, title: str, symptom: str) -> Pitfall:
    """One row of the registry; an unknown lesson or kind is an error here, at import."""
    pitfall = Pitfall(pid, title, tuple(lessons.split()), kind, symptom)
    unknown = [n for n in pitfall.lessons if n not in NOTEBOOKS]
    if not pitfall.lessons or unknown or kind not in KINDS:
        raise ValueError(f"pitfall {pid}: lessons {lessons!r} (known: {', '.join(NOTEBOOKS)})"
                         f" and kind {kind!r} (known: {', '.join(KINDS)})")
    return pitfall


def _registry(*rows: Pitfall) -> dict[str, Pitfall]:
    ids = [p.id for p in rows]
    twice = sorted({pid for pid in ids if ids.count(pid) > 1})
    if twice:
        raise ValueError(f"pitfall ids with two rows: {twice}")
    return {p.id: p for p in rows}


# The id families (docs/design.md): P01-P20 the catalogue of common DDP pitfalls the course
# started from, in its order; S1-S5 sharp edges; B1-B3 disasters that end a job;
# X1... found while writing the course.
# TP1-TP9 tensor parallelism (lesson 16);
# PP1-PP9 pipeline parallelism (lesson 17);
# (id, lessons, kind, title, symptom)
PITFALLS: dict[str, Pitfall] = _registry(
    _row("P01", "01", "slow",
         "nn.DataParallel instead of DDP (on CPU it silently runs one replica)",
         "a second GPU barely speeds training up, and GPU 0 fills up first"),
    _row("P02", "02", "wrong", "DDP wrapped around a model before it is moved to its device",
         "the ranks' weights drift apart although the model is wrapped in DDP"),
    _row("P03", "03", "wrong", "no DistributedSampler: every rank trains on the same samples",
         "an epoch takes as long on N ranks as on one: every rank reads every sample"),
    _row("P04", "03", "wrong", "set_epoch() never called: the same shuffle every epoch",
         "every epoch reads the batches in the same order"),
    _row("P05", "05", "wrong", "plain BatchNorm normalises with each rank's own batch statistics",
         "small per-GPU batches train worse than one big batch (BatchNorm)"),
    _row("P06", "02", "crash", "loss function or targets on a different device than the outputs",
         '"Expected all tensors to be on the same device" in the loss'),
    _row("P07", "02", "crash", "hard-coded cuda:0 instead of the rank's LOCAL_RANK device",
         "every rank lands on GPU 0: out of memory or NCCL errors there"),
    _row("P08", "01", "wrong",
         "ranks initialised differently (DDP broadcasts rank 0's weights; manual sync must)",
         "the ranks' models differ after loading a checkpoint"),
    _row("P09", "07", "slow",
         "gradient accumulation without no_sync(): an all-reduce every micro-step",
         "gradient accumulation makes a step no cheaper: an all-reduce per micro-step"),
    _row("P10", "04", "crash", "find_unused_parameters / unused parameters and static_graph",
         '"Expected to have finished reduction in the prior iteration" at step 2'),
    _row("P11", "06", "slow", "tuning communication before profiling",
         "I tuned buckets or the backend and the step is no faster"),
    _row("P12", "11", "crash", "checkpoint saved from the DDP wrapper: 'module.' key prefix",
         '"Unexpected key(s) in state_dict: module.…" when loading a checkpoint'),
    _row("P13", "14", "hang", "multi-node run without checking the nodes can reach each other",
         "a multi-node job hangs at start-up, in init_process_group"),
    _row("P14", "08 14", "crash", "wrong network interface for the backend",
         '"Unable to find address for: eth1" (a network interface) at start-up'),
    _row("P15", "11", "crash",
         "loading a checkpoint before rank 0 finished writing it (no barrier)",
         "loading the new checkpoint fails on some ranks, or they load the old one"),
    _row("P16", "02", "wrong", "every rank logs and prints",
         "every log line appears once per rank"),
    _row("P17", "05", "crash", "dropout and other random state differing between ranks",
         '"Received data size doesn\'t match expected size", or masks differ per rank'),
    _row("P18", "03", "crash", "shuffle=True together with a DistributedSampler",
         '"sampler option is mutually exclusive with shuffle"'),
    _row("P19", "10", "wrong", "mixing synchronous and asynchronous collectives",
         "an all-reduced value is sometimes wrong (read before wait())"),
    _row("P20", "03 10", "hang", "uneven last batches and inputs across ranks",
         'the job hangs, or dies with "Connection closed by peer", at an epoch\'s end'),
    _row("S1", "10", "hang", "ranks take different paths and call different collectives: a hang",
         "the job hangs with no error: ranks wait in different collectives"),
    _row("S2", "13", "slow",
         "CPU offload does not help when parameters must all fit during forward",
         "CPU offload does not lower the GPU memory I need"),
    _row("S3", "09", "wrong", "fp16 gradients underflow without loss scaling",
         "with fp16 the loss does not move: the gradients are zero"),
    _row("S4", "03", "wrong", "DistributedSampler without set_epoch() (the same pitfall as P04)",
         "every epoch reads the batches in the same order"),
    _row("S5", "11", "crash", "sharded checkpoint saved at one world size, loaded at another",
         "a sharded checkpoint does not load after the number of ranks changed"),
    _row("B1", "11", "crash", "one rank runs out of memory and the whole job dies with it",
         "one rank runs out of memory and the whole job dies"),
    _row("B2", "10", "hang", "the job hangs with no error",
         "the job hangs with no error and no output"),
    _row("B3", "12", "varies",
         "results differ from run to run (seeds, determinism, DataLoader workers)",
         "two runs with the same seed give different results"),
    _row("X1", "03", "wrong", "evaluation double-counts the samples DistributedSampler pads",
         "validation accuracy differs from a one-GPU evaluation of the same model"),
    _row("X2", "03", "wrong", "metrics reported from one rank without reducing over ranks",
         "the logged metric is rank 0's, not the whole validation set's"),
    _row("X3", "05", "hang", "rank-0-only evaluation through the DDP wrapper hangs",
         "evaluating on rank 0 only hangs (rank 0 waits in _sync_buffers)"),
    _row("X4", "00", "wrong", "per-rank randomness makes ranks disagree",
         "ranks compute different values from the same code"),
    _row("X5", "00", "crash", "a failing or hanging rank: what the error looks like",
         'one rank fails and the others say "Connection closed by peer"'),
    _row("X6", "07", "wrong",
         "accumulated micro-batch losses not divided by k: a k times larger learning rate",
         "with accumulation, training acts as if the learning rate were k times larger"),
    _row("X7", "07", "wrong", "accumulation over micro-batches of unequal sizes: a mean of means",
         "the accumulated gradient is not the big batch's when micro-batches differ"),
    _row("X8", "11", "crash", "a crash in the middle of torch.save leaves a corrupt checkpoint",
         'after a crash the checkpoint will not load ("failed reading zip archive")'),
    _row("X9", "09", "wrong",
         "gradients clipped before GradScaler.unscale_(): every step shrunk by the scale",
         "with GradScaler and clipping, the weights barely move"),
    _row("X10", "09", "crash",
         "GradScaler calls inside the accumulation loop (unscale_ or update per micro-step)",
         'GradScaler: "unscale_() has already been called" or "No inf checks were recorded"'),
    # Tensor parallelism (lesson 16)
    _row("TP1", "16", "wrong",
         "a hand-written row-parallel layer without its all-reduce: each rank keeps a partial sum",
         "each rank's output of a layer split by hand is plausible, and wrong"),
    _row("TP2", "16", "slow",
         "every layer column-parallel and gathered: two all-gathers per MLP block, not one "
         "all-reduce",
         "tensor parallelism is slower than expected: an all_gather after every linear layer"),
    _row("TP3", "16", "crash",
         "ColwiseParallel and RowwiseParallel swapped (or a layout that does not match the input)",
         '"a and b must have same reduction dim" in the first forward after parallelize_module'),
    _row("TP4", "16", "wrong",
         "tensor-parallel ranks fed different batches (a DistributedSampler over the TP ranks)",
         "with tensor parallelism the model learns worse, with no error"),
    _row("TP5", "16", "wrong",
         "dropout seeded per rank in a tensor-parallel group: the replicated activations differ",
         "with dropout on, the ranks of one tensor-parallel group log different losses"),
    _row("TP6", "16", "wrong",
         "gradients clipped by the norm of each rank's local shards: the wrong norm",
         "with gradient clipping the TP run trains differently from one GPU"),
    _row("TP7", "16", "slow",
         "the logits gathered on every rank for the loss instead of loss_parallel",
         "memory at the loss does not shrink with tensor parallelism (the full logits per rank)"),
    _row("TP8", "16", "wrong",
         "a 2-D (data x tensor) mesh whose sampler and seeds come from the global rank",
         "a data x tensor parallel job learns worse than the same model under DDP"),
    _row("TP9", "16", "crash",
         "clip_grad_norm_ over DTensor and plain parameters together",
         '"got mixed torch.Tensor and DTensor" from clip_grad_norm_'),
    # Pipeline parallelism (lesson 17)
    _row("PP1", "17", "slow",
         "fewer micro-batches than pipeline stages: most of every stage's time is the bubble",
         "with the model split over more ranks, each rank sits idle most of the step"),
    _row("PP2", "17", "slow",
         "GPipe keeps every micro-batch's activations until its backward: memory grows with m",
         "raising the number of micro-batches runs the first pipeline stage out of memory"),
    _row("PP3", "17", "hang",
         "a hand-written 1F1B pipeline with blocking sends: two neighbours both send",
         "a hand-written pipeline hangs at its first backward, both ranks in send"),
    _row("PP4", "17", "crash",
         "the loss exists only on the last pipeline stage: logging it on rank 0",
         '"stack expects a non-empty TensorList" when rank 0 logs the loss, or no loss logged'),
    _row("PP5", "17", "wrong",
         "micro-batch losses summed, not averaged (scale_grads=False with a mean loss), or "
         "divided twice",
         "a pipelined model trains as if its learning rate were m times larger (or smaller)"),
    _row("PP6", "17", "wrong",
         "BatchNorm in a pipeline stage normalises each micro-batch, not the batch",
         "a BatchNorm model trains differently once pipelined, on the same batches"),
    _row("PP7", "17", "wrong",
         "tied weights on the first and last stage: each copy gets only its own gradient",
         "the tied embedding and output layer drift apart under pipelining"),
    _row("PP8", "17", "crash",
         "a short last batch: the stages' buffers keep the first step's micro-batch shape",
         '"The size of tensor a (8) must match the size of tensor b (7)" at an epoch\'s end'),
    _row("PP9", "17", "wrong",
         "PipelineStage's shape inference runs each stage once more (on torch.empty past "
         "stage 0): BatchNorm's running statistics are corrupted",
         "a pipelined BatchNorm model evaluates badly from the first step"),
)

# Ids that name the same pitfall as another: cells declare the other one.
SAME_AS = {"S4": "P04"}
if not set(SAME_AS) | set(SAME_AS.values()) <= set(PITFALLS):
    raise ValueError(f"SAME_AS names an id without a row: {SAME_AS}")

_ID = re.compile(r"^(P(0[1-9]|1[0-9]|20)|S[1-5]|B[1-3]|X[1-9][0-9]*|TP[1-9]|PP[1-9])$")


def id_problem(pid: object) -> str | None:
    """Why `pid` is not a pitfall id cells may name, or None when it is one."""
    if not isinstance(pid, str) or not _ID.match(pid):
        return (f"pitfall id {pid!r} is not of the form P01-P20, S1-S5, B1-B3, X<number>"
                ", TP1-TP9, PP1-PP9")
    if pid not in PITFALLS:
        return (f"pitfall id {pid!r} is not in the registry (course_lib/pitfalls.py); "
                "add it there with its title and lesson first")
    if pid in SAME_AS:
        return f"{pid} is the same pitfall as {SAME_AS[pid]}: declare {SAME_AS[pid]}"
    return None
