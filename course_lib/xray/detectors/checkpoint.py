"""Detector: checkpoints: DDP's 'module.' prefix in a loaded state dict (P12), and a load
that raced another rank's save of the same file (P15)."""

from __future__ import annotations

import os

from course_lib.xray.events import Load, LoadStateDict, Save
from course_lib.xray.report import Finding, finding
from course_lib.xray.rules import rule
from course_lib.xray.run_events import RunEvents

SOON_MS = 1000  # a failed load this close before another rank's save of the file raced it


def _nothing_loaded(run: RunEvents) -> str:
    if run.of(LoadStateDict):
        return ""
    prefixed = [e for _, e in run.of(Save) if e["prefixed"]]
    return (f"the checkpoint saved at {prefixed[0]['where']} has 'module.' keys but no state "
            f"dict was loaded in this run" if prefixed else "no state dict was loaded into a model")


def _no_save_and_load(run: RunEvents) -> str:
    if not run.of(Save):
        return "no checkpoint was saved with torch.save"
    return "" if run.of(Load) else "no checkpoint was loaded with torch.load"


@rule("P12", needs=(LoadStateDict, Save), unjudged=_nothing_loaded,
      absent="no state dict with DDP's 'module.' keys was loaded into a plain model, nor one "
             "without them into the DDP wrapper")
def _p12(run: RunEvents) -> Finding | None:
    """A state dict loaded into a module whose keys do not carry the same DDP prefix."""
    for rank, e in run.of(LoadStateDict):
        if not e["keys"]:
            continue
        into_plain = not e["wrapper"] and e["prefixed"]
        into_ddp = e["wrapper"] and not e["prefixed"]
        failed = e.get("error") or e.get("missing") or e.get("unexpected")
        if not (into_plain or into_ddp) or not failed:
            continue  # a model whose own keys start with 'module.' loads them cleanly
        what = (f"a state dict whose {e['prefixed']} of {e['keys']} keys start with "
                f"'module.' into a plain {e['module']}" if into_plain else
                "a state dict without 'module.' keys into the DDP wrapper")
        if e.get("error"):
            outcome = f": {_key_error(e['error'])}"
        else:
            outcome = (f" with strict=False: {e.get('missing', 0)} of the model's keys were "
                       f"left unloaded")
        origin = next((s["where"] for _, s in run.of(Save) if s["prefixed"]), "")
        saved = f" (saved from the wrapper at {origin})" if origin and into_plain else ""
        return finding("P12", f"rank {rank} loaded {what}{outcome}{saved}", e["where"])
    return None


def _key_error(error: str) -> str:
    """The line of a load_state_dict error that names the keys, shortened."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    keys = [line for line in lines if "key(s)" in line]
    return (keys[-1] if keys else lines[0])[:100]


@rule("P15", needs=(Save, Load), unjudged=_no_save_and_load,
      absent="no rank loaded a checkpoint while, or before, another rank saved it")
def _p15(run: RunEvents) -> Finding | None:
    """A load by one rank that began before another rank's save of the same file ended:
    while it was written, or before it was written when the saver itself read it after."""
    saves = run.of(Save)
    if not saves:
        return None
    loads = run.of(Load)
    for rank, load in loads:
        for saver, save in saves:
            if saver == rank or save["path"] != load["path"]:
                continue
            why = _race(load, save, _saver_reads(loads, saver, rank, load, save))
            if why:
                name = os.path.basename(load["path"])
                return finding("P15", f"rank {rank}'s torch.load({name!r}) {why} rank "
                                      f"{saver}'s torch.save of it"
                                      f"{_sizes(load, save)}", load["where"])
    return None


def _race(load: Load, save: Save, saver_reads: str) -> str:
    """How the load raced the save, or "" when it did not. `saver_reads` says whether the
    saving rank's matching load came "after" its save, "before" it, or "never"."""
    save_end = save.get("t_end", float("inf"))
    load_end = load.get("t_end", load["t"])
    if load["t"] >= save_end:
        meant = saver_reads == "after" or saver_reads == "never"
        if meant and "collectives" in save and not _ordered(load, save):
            late = (load["t"] - save_end) * 1000
            return (f"began {late:.1f} ms after, by luck: no barrier, collective or DDP "
                    f"step made it wait for the end of")
        return ""
    ms = (save_end - load["t"]) * 1000 if save_end != float("inf") else None
    early = f"began {ms:.0f} ms before the end of" if ms is not None else "began during"
    gap = (save["t"] - load_end) * 1000
    soon = saver_reads == "never" and gap < SOON_MS  # the saver writes it for the others
    if load.get("error") and (load_end > save["t"] or saver_reads == "after" or soon):
        return f"failed ({load['error'].split(':')[0]}); it {early}"
    if load_end > save["t"]:
        return f"overlapped: it {early}"
    if saver_reads == "after":
        return f"read the file {gap:.0f} ms before the start of"
    return ""


def _ordered(load: Load, save: Save) -> bool:
    """The loading rank had finished a collective (or DDP backward) that the saving rank
    began only after its save ended: the load could not have come first."""
    return (load["collectives"] > save["collectives"]
            or load["ddp_backwards"] > save["ddp_forwards"])


def _saver_reads(loads: list[tuple[int, Load]], saver: int, rank: int, load: Load,
                 save: Save) -> str:
    """Whether the saver's load of the file that matches this rank's (the same count of
    loads of that file) came "after" its save (the file this rank read was meant to be the
    new one), "before" it, or "never" (the saver does not read the file)."""
    mine = [e for r, e in loads if r == rank and e["path"] == load["path"]]
    theirs = [e for r, e in loads if r == saver and e["path"] == load["path"]]
    index = next(i for i, e in enumerate(mine) if e is load)
    if not theirs:
        return "never"
    if index < len(theirs) and theirs[index]["t"] >= save.get("t_end", float("inf")):
        return "after"
    return "before"


def _sizes(load: Load, save: Save) -> str:
    if load["size"] < 0:
        seen = "the file did not exist yet"
    else:
        seen = f"the file had {load['size']} bytes"
    if save.get("size", -1) >= 0 and load["size"] != save["size"]:
        return f" ({seen} when it began; the save wrote {save['size']})"
    return ""
