"""Why the x-ray could not judge a script: the report's first line when it did not train here.

A script that needs a GPU on a CPU machine, that starts its own processes (or none), that
its argument parser stopped, or that exited or returned before training shows none of the
pitfalls, and "no pitfalls found" would mislead. `cause` names the cause in words, with
the learner's line, and says what to do; the report then judges nothing it did not see.
It reads the probes' events (spawn, exit, GPU queries) and the failed ranks' tracebacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course_lib.xray.events import (
    Collective,
    DdpBufferSync,
    Exit,
    GpuQuery,
    InitProcessGroup,
    OptStep,
    Pass,
    Print,
    Spawn,
)
from course_lib.xray.record import is_own, location
from course_lib.xray.run_events import RunEvents

if TYPE_CHECKING:
    from course_lib.launching.errors import RankFailure

# torch's words when a GPU-only call runs without CUDA (torch 2.11-2.15, CPU builds
# included: "Torch not compiled with CUDA enabled", "_cuda_setDevice", "Cannot access
# accelerator device when none is available", ...).
_GPU = re.compile(r"_cuda_\w+|not compiled with CUDA|compiled without CUDA|No CUDA GPUs|"
                  r"Found no NVIDIA driver|invalid device ordinal|CUDA driver|requires CUDA|"
                  r"accelerator device when none is available|dummy base class (Event|Stream)|"
                  r"ProcessGroupNCCL|NCCL (is )?not (available|built)")
_GPU_CODE = ("/torch/cuda/", "/torch/accelerator/")  # a frame there: a GPU-only call
_FRAME = re.compile(r'^\s*(?:File "(?P<file>[^"]+)", line (?P<line>\d+)|'
                    r'(?P<cell>Cell In\[\d+\]), line (?P<cell_line>\d+)), in (?P<fn>\S+)')
_ARG_ERROR = re.compile(r"^[\w.\-]+: error: (.*)$", re.MULTILINE)  # argparse's own format
_NO_GPU = ("0", "False", "None")  # answers to a GPU query on a machine without one
DIRECTLY = ("The x-ray starts the ranks itself, as torchrun does (RANK, LOCAL_RANK and "
            "WORLD_SIZE set): when RANK is set, call the training function directly instead "
            "of mp.spawn.")
ON_CPU = ("To try it on the CPU, let it choose the device: torch.device('cuda', local_rank) "
          "if torch.cuda.is_available() else torch.device('cpu'), the 'gloo' backend without "
          "GPUs, and no device_ids in DDP; or run it on a GPU machine.")


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback's text: the file (or notebook cell), line, function and
    the source line under it."""

    file: str
    line: int
    function: str
    source: str

    @property
    def where(self) -> str:
        return f"{self.file}, line {self.line}" if self.file.startswith("Cell ") \
            else location(self.file, self.line)


def trained(run: RunEvents) -> bool:
    """The run reached training: an optimizer step, a collective of the learner's, a DDP
    forward that synced buffers, or a batch from a DataLoader."""
    return bool(run.of(OptStep) or run.of(Collective) or run.of(DdpBufferSync)
                or any(p["sizes"] for _, p in run.of(Pass)))


def cause(run: RunEvents) -> str:
    """One line: why the script did not train here (or did not train as it should) and what
    to do; "" when it trained and nothing stopped the x-ray from watching it."""
    failures = list(run.error.failures) if run.error is not None else []
    spawned = run.of(Spawn)
    if spawned and spawned[0][1]["nprocs"]:
        return _own_processes(spawned[0][1])
    if spawned and not trained(run):
        return _nothing_launched(run, spawned[0][1])
    nccl = [e for _, e in run.of(InitProcessGroup) if e["backend"] == "nccl"]
    gpu = next((f for f in failures if _needs_gpu(f, nccl)), None)
    if gpu is not None:
        return _cannot_run(gpu)
    empty = [e for _, e in run.of(InitProcessGroup) if e["world_size"] == 0]
    if empty and not trained(run):
        return _no_world(run, empty[0])
    usage = _usage_error(run, failures)
    if usage:
        return usage
    if trained(run):
        return ""
    exits = run.of(Exit)
    if exits:
        return _exited(run, exits[0][1])
    if failures:  # a bug of the script's own: its error says it, and the rules may explain it
        return _failed(run, failures[0]) if _no_gpu_answers(run) else ""
    return (f"The script ended before training: every rank returned without a DDP forward, an "
            f"optimizer step, a DataLoader batch or a collective{_printed(run)}{_gpu_said(run)}"
            f". Nothing was judged: {_what_to_do(run)}")


def _own_processes(e: Spawn) -> str:
    return (f"Cannot x-ray it as it is: mp.spawn({e['fn']}, nprocs={e['nprocs']}) at "
            f"{e['where']} starts processes of its own, which the x-ray cannot watch (it "
            f"refused them). {DIRECTLY}")


def _nothing_launched(run: RunEvents, e: Spawn) -> str:
    counted = [q for _, q in run.of(GpuQuery) if q["t"] < e["t"] and "device_count" in q["call"]]
    came = (f"; {counted[-1]['call']} returned {counted[-1]['result']} on this machine just "
            f"before (at {counted[-1]['where']})" if counted else "")
    return (f"Nothing was launched: mp.spawn({e['fn']}, nprocs=0) at {e['where']} started no "
            f"process, so no rank trained{came}. {DIRECTLY}")


def frames(traceback: str) -> list[Frame]:
    """The frames of a traceback's text, outermost first (a frame's source is the indented
    line under it, "" when there is none)."""
    lines = [*traceback.splitlines(), ""]
    found = []
    for i, text in enumerate(lines[:-1]):
        m = _FRAME.match(text)
        if m:
            below = lines[i + 1]
            source = below.strip() if below[:1].isspace() and not _FRAME.match(below) else ""
            found.append(Frame(m["file"] or m["cell"], int(m["line"] or m["cell_line"]),
                               m["fn"], source))
    return found


def learner_frame(f: RankFailure) -> Frame | None:
    """The innermost frame of the learner's code in a failure's traceback."""
    own = [fr for fr in frames(f.traceback) if fr.file.startswith("Cell ") or is_own(fr.file)]
    return own[-1] if own else None


def _needs_gpu(f: RankFailure, nccl: list[InitProcessGroup]) -> bool:
    """The rank failed in a GPU-only call: torch's CUDA code raised, or its message is
    torch's for a missing GPU, or the call that failed asked for an NCCL process group."""
    frame = learner_frame(f)
    asked_nccl = frame is not None and any(
        e["where"].rsplit(":", 1)[-1] == str(frame.line) for e in nccl)
    return bool(_GPU.search(f.message)) or asked_nccl or any(
        any(part in fr.file for part in _GPU_CODE) for fr in frames(f.traceback))


def _cannot_run(f: RankFailure) -> str:
    import torch

    from course_lib import devices

    frame = learner_frame(f)
    call = f"{frame.where} `{frame.source}`" if frame and frame.source else \
        (frame.where if frame else "a line of the script")
    if torch.version.cuda is None:
        machine = f"this torch ({torch.__version__}) is built without CUDA"
    else:
        machine = f"this machine has {devices.visible_gpus()} GPU(s) that CUDA can see"
    return (f"Cannot run here: {call} needs a GPU, and {machine} (rank {f.rank}: "
            f"{f.error_type or 'error'}: {_short(f.message)}). {ON_CPU}")


def _no_world(run: RunEvents, e: InitProcessGroup) -> str:
    counted = [q for _, q in run.of(GpuQuery) if "device_count" in q["call"]]
    came = (f"; {counted[-1]['call']} returned {counted[-1]['result']} on this machine just "
            f"before (at {counted[-1]['where']})" if counted else "")
    return (f"Cannot run here: init_process_group(world_size=0) at {e['where']} asks for a "
            f"job of no process{came}. Take the world size from the launcher: "
            f"int(os.environ['WORLD_SIZE']), as torchrun (and the x-ray) sets it.")


def _usage_error(run: RunEvents, failures: list[RankFailure]) -> str:
    """The script's argparse stopped it with an error (exit status 2 and its message)."""
    stopped = [e for _, e in run.of(Exit) if e["library"] == "argparse" and e["code"] == "2"]
    text = "\n".join([*run.logs.values(), *("\n".join(f.output_tail) for f in failures)])
    said = _ARG_ERROR.search(text)
    if not stopped or not said:
        return ""
    return (f"Cannot run here: the script's own argument parser stopped it at "
            f"{stopped[0]['where']} ({said[1].strip()}). Put the script's arguments after "
            f"its name: python -m course_lib xray [options] script.py ARGS.")


def _exited(run: RunEvents, e: Exit) -> str:
    everyone = len({r for r, _ in run.of(Exit)}) >= run.world_size
    who = "on every rank" if everyone else f"on rank {run.of(Exit)[0][0]}"
    if e["library"] == "argparse":
        how = "its argument parser exited (it printed its usage or help)"
    elif e["library"]:
        how = f"exit({'' if e['code'] == 'None' else e['code']}) ended it"
    else:
        how = f"sys.exit({'' if e['code'] == 'None' else e['code']}) ended it"
    return (f"The script exited before training: {how} at {e['where']} {who}{_printed(run)}"
            f"{_gpu_said(run)}. Nothing was judged: {_what_to_do(run)}")


def _failed(run: RunEvents, f: RankFailure) -> str:
    """A failure before training in a script that had found no GPU: it expects one."""
    frame = learner_frame(f)
    at = f" at {frame.where}" if frame else ""
    raised = f.error_type or "an error"
    return (f"The script failed before training: rank {f.rank} raised {raised}{at} "
            f"({_short(f.message)}){_gpu_said(run)}. Nothing was judged: {_what_to_do(run)}")


def _short(message: str, limit: int = 100) -> str:
    """The message's first sentence, or its first `limit` characters cut at a word."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    sentence = first.split(". ")[0].rstrip(".:")
    if len(sentence) <= limit:
        return sentence
    return sentence[:limit].rsplit(" ", 1)[0] + " ..."


def _printed(run: RunEvents) -> str:
    """', after printing 'Unable to locate ...' (example.py:99)' from the last print."""
    said = run.of(Print)
    if not said:
        return ""
    text, where = said[-1][1]["text"], said[-1][1]["where"]
    return f", after printing {text[:80]!r} ({where})"


def _no_gpu_answers(run: RunEvents) -> list[GpuQuery]:
    return [q for _, q in run.of(GpuQuery) if q["result"] in _NO_GPU]


def _gpu_said(run: RunEvents) -> str:
    """'; torch.cuda.device_count() was 0 here (example.py:17)' when the script asked."""
    answers = _no_gpu_answers(run)
    if not answers:
        return ""
    q = answers[0]
    return f"; it asked for GPUs and {q['call']} was {q['result']} here ({q['where']})"


def _what_to_do(run: RunEvents) -> str:
    if _no_gpu_answers(run):
        return f"the script expects GPUs and this machine has none. {ON_CPU}"
    return ("make it reach its training loop on this machine (its arguments go after its "
            "name: python -m course_lib xray [options] script.py ARGS).")
