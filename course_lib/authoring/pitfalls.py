"""The pitfall registry: every id a lesson cell may name, its title, the lessons that plan
to cover it (the curriculum map in docs/design.md), and what a learner sees (the course map,
docs/course-map.md). New X-ids are added here first, with their symptom."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Pitfall:
    """One pitfall: `id` as cells name it, a one-line title, the lessons planned for it, and
    what a learner meets: `kind` (a key of KINDS) and `symptom`, in the learner's own words."""

    id: str
    title: str
    lessons: tuple[str, ...]
    kind: str = ""
    symptom: str = ""


def _table(rows: str) -> dict[str, Pitfall]:
    """Parse 'ID | lessons | title' lines into the registry."""
    pitfalls = {}
    for line in rows.strip().splitlines():
        pid, lessons, title = (part.strip() for part in line.split("|"))
        pitfalls[pid] = Pitfall(pid, title, tuple(lessons.split()))
    return pitfalls


# The id families (docs/design.md): P01-P20 the catalogue of common DDP pitfalls the course
# started from, in its order; S1-S5 sharp edges; B1-B3 disasters that end a job;
# X1... found while writing the course.
PITFALLS: dict[str, Pitfall] = _table("""
P01 | 01    | nn.DataParallel instead of DDP (on CPU it silently runs one replica)
P02 | 02    | DDP wrapped around a model before it is moved to its device
P03 | 03    | no DistributedSampler: every rank trains on the same samples
P04 | 03    | set_epoch() never called: the same shuffle every epoch
P05 | 05    | plain BatchNorm normalises with each rank's own batch statistics
P06 | 02    | loss function or targets on a different device than the outputs
P07 | 02    | hard-coded cuda:0 instead of the rank's LOCAL_RANK device
P08 | 01    | ranks initialised differently (DDP broadcasts rank 0's weights; manual sync must)
P09 | 07    | gradient accumulation without no_sync(): an all-reduce every micro-step
P10 | 04    | find_unused_parameters / unused parameters and static_graph
P11 | 06    | tuning communication before profiling
P12 | 11    | checkpoint saved from the DDP wrapper: 'module.' key prefix
P13 | 14    | multi-node run without checking the nodes can reach each other
P14 | 08 14 | wrong network interface for the backend
P15 | 11    | loading a checkpoint before rank 0 finished writing it (no barrier)
P16 | 02    | every rank logs and prints
P17 | 05    | dropout and other random state differing between ranks
P18 | 03    | shuffle=True together with a DistributedSampler
P19 | 10    | mixing synchronous and asynchronous collectives
P20 | 03 10 | uneven last batches and inputs across ranks
S1  | 10    | ranks take different paths and call different collectives: a hang
S2  | 13    | CPU offload does not help when parameters must all fit during forward
S3  | 09    | fp16 gradients underflow without loss scaling
S4  | 03    | DistributedSampler without set_epoch() (the same pitfall as P04)
S5  | 11    | sharded checkpoint saved at one world size, loaded at another
B1  | 11    | one rank runs out of memory and the whole job dies with it
B2  | 10    | the job hangs with no error
B3  | 12    | results differ from run to run (seeds, determinism, DataLoader workers)
X1  | 03    | evaluation double-counts the samples DistributedSampler pads
X2  | 03    | metrics reported from one rank without reducing over ranks
X3  | 05    | rank-0-only evaluation through the DDP wrapper hangs
X4  | 00    | per-rank randomness makes ranks disagree
X5  | 00    | a failing or hanging rank: what the error looks like
X6  | 07    | accumulated micro-batch losses not divided by k: a k times larger learning rate
X7  | 07    | accumulation over micro-batches of unequal sizes: a mean of means
X8  | 11    | a crash in the middle of torch.save leaves a corrupt checkpoint
X9  | 09    | gradients clipped before GradScaler.unscale_(): every step shrunk by the scale
X10 | 09    | GradScaler calls inside the accumulation loop (unscale_ or update per micro-step)
""")

# What a learner sees first, the headings of the course map, in its order.
KINDS = {
    "hang": "The job hangs or times out",
    "crash": "The job stops with an error",
    "wrong": "Numbers, weights or output are wrong, or differ between ranks",
    "slow": "Training is slower, or needs more memory, than it should",
    "varies": "Results change from run to run",
}

# Each id's symptom as a learner would describe it (kind | words); the course map's index.
SYMPTOMS = """
P01 | slow   | a second GPU barely speeds training up, and GPU 0 fills up first
P02 | wrong  | the ranks' weights drift apart although the model is wrapped in DDP
P03 | wrong  | an epoch takes as long on N ranks as on one: every rank reads every sample
P04 | wrong  | every epoch reads the batches in the same order
P05 | wrong  | small per-GPU batches train worse than one big batch (BatchNorm)
P06 | crash  | "Expected all tensors to be on the same device" in the loss
P07 | crash  | every rank lands on GPU 0: out of memory or NCCL errors there
P08 | wrong  | the ranks' models differ after loading a checkpoint
P09 | slow   | gradient accumulation makes a step no cheaper: an all-reduce per micro-step
P10 | crash  | "Expected to have finished reduction in the prior iteration" at step 2
P11 | slow   | I tuned buckets or the backend and the step is no faster
P12 | crash  | "Unexpected key(s) in state_dict: module.…" when loading a checkpoint
P13 | hang   | a multi-node job hangs at start-up, in init_process_group
P14 | crash  | "Unable to find address for: eth1" (a network interface) at start-up
P15 | crash  | loading the new checkpoint fails on some ranks, or they load the old one
P16 | wrong  | every log line appears once per rank
P17 | crash  | "Received data size doesn't match expected size", or masks differ per rank
P18 | crash  | "sampler option is mutually exclusive with shuffle"
P19 | wrong  | an all-reduced value is sometimes wrong (read before wait())
P20 | hang   | the job hangs, or dies with "Connection closed by peer", at an epoch's end
S1  | hang   | the job hangs with no error: ranks wait in different collectives
S2  | slow   | CPU offload does not lower the GPU memory I need
S3  | wrong  | with fp16 the loss does not move: the gradients are zero
S4  | wrong  | every epoch reads the batches in the same order
S5  | crash  | a sharded checkpoint does not load after the number of ranks changed
B1  | crash  | one rank runs out of memory and the whole job dies
B2  | hang   | the job hangs with no error and no output
B3  | varies | two runs with the same seed give different results
X1  | wrong  | validation accuracy differs from a one-GPU evaluation of the same model
X2  | wrong  | the logged metric is rank 0's, not the whole validation set's
X3  | hang   | evaluating on rank 0 only hangs (rank 0 waits in _sync_buffers)
X4  | wrong  | ranks compute different values from the same code
X5  | crash  | one rank fails and the others say "Connection closed by peer"
X6  | wrong  | with accumulation, training acts as if the learning rate were k times larger
X7  | wrong  | the accumulated gradient is not the big batch's when micro-batches differ
X8  | crash  | after a crash the checkpoint will not load ("failed reading zip archive")
X9  | wrong  | with GradScaler and clipping, the weights barely move
X10 | crash  | GradScaler: "unscale_() has already been called" or "No inf checks were recorded"
"""


def _add_symptoms(pitfalls: dict[str, Pitfall], rows: str) -> dict[str, Pitfall]:
    """The registry with each 'ID | kind | symptom' line's kind and symptom added."""
    for line in rows.strip().splitlines():
        pid, kind, symptom = (part.strip() for part in line.split("|", 2))
        if pid in pitfalls:  # an unknown id fails tests/test_course_map.py, not every import
            pitfalls[pid] = replace(pitfalls[pid], kind=kind, symptom=symptom)
    return pitfalls


PITFALLS = _add_symptoms(PITFALLS, SYMPTOMS)

# Ids that name the same pitfall as another: cells declare the other one.
SAME_AS = {"S4": "P04"}

_ID = re.compile(r"^(P(0[1-9]|1[0-9]|20)|S[1-5]|B[1-3]|X[1-9][0-9]*)$")


def id_problem(pid: object) -> str | None:
    """Why `pid` is not a pitfall id cells may name, or None when it is one."""
    if not isinstance(pid, str) or not _ID.match(pid):
        return (f"pitfall id {pid!r} is not of the form P01-P20, S1-S5, B1-B3 or X<number>")
    if pid not in PITFALLS:
        return (f"pitfall id {pid!r} is not in the registry (course_lib/authoring/pitfalls.py); "
                "add it there with its title and lesson first")
    if pid in SAME_AS:
        return f"{pid} is the same pitfall as {SAME_AS[pid]}: declare {SAME_AS[pid]}"
    return None
