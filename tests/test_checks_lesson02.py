"""Lesson 02's exercise checks: each accepts the worked solution and a differently written
correct answer, and rejects plausible wrong answers with the hint that names their symptom."""

import os

import pytest
import torch
import torch.distributed as dist
from checking import check_helpers
from torch import nn

from course_lib import rank_device
from course_lib.checks.lesson02 import check_pick_device, check_to_device

NOTEBOOK = "02_setup_checklist.ipynb"
FAST = 6  # seconds


solution, accepts, rejects = check_helpers(NOTEBOOK, FAST)



# -- pick_device ----------------------------------------------------------------------------

def device_by_set_device():
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        return "cuda"
    return "cpu"


def device_by_accelerator():
    local_ranks = int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.accelerator.is_available() and torch.accelerator.device_count() >= local_ranks:
        torch.accelerator.set_device_index(int(os.environ["LOCAL_RANK"]))
        return torch.accelerator.current_accelerator()
    return torch.device("cpu")


def device_is_available_only():  # this notebook's solution until issue 26
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")


def device_first_gpu():
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def device_global_rank():
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ["RANK"]))
    return torch.device("cpu")


def device_dist_rank():
    return torch.device(f"cuda:{dist.get_rank()}" if torch.cuda.is_available() else "cpu")


def device_no_fallback():
    return torch.device("cuda", int(os.environ["LOCAL_RANK"]))


def device_by_backend():
    return rank_device()  # gloo in the check: always the CPU


def device_world_size_guard():  # compares with every machine's ranks, not this machine's
    if torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"]):
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")


def device_as_number():
    return int(os.environ["LOCAL_RANK"]) if torch.cuda.is_available() else "cpu"


def device_rank_mod_count():  # PyTorch's DDP tutorial: two ranks share one GPU here
    if torch.cuda.is_available():
        return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def device_per_rank_guard():  # the ranks with a GPU of their own use it, the others the CPU
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank < torch.cuda.device_count():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def device_rank_mod_two():
    if torch.cuda.is_available():
        return torch.device("cuda", dist.get_rank() % 2)
    return torch.device("cpu")


@pytest.mark.parametrize("fn", ["solution", device_by_set_device, device_by_accelerator])
def test_pick_device_accepts(fn, capsys):
    accepts(check_pick_device, solution("pick_device") if fn == "solution" else fn, capsys)


SHORT = "on 1 machine with 1 GPU and 2 ranks"


@pytest.mark.parametrize("fn, hint", [
    (device_is_available_only, f"{SHORT}, rank 1 chose cuda:1, a GPU this machine does not "
                               "have (CUDA: \"invalid device ordinal\")"),
    (device_no_fallback, f"{SHORT}, rank 1 chose cuda:1"),
    (device_rank_mod_count, f"{SHORT}, the ranks chose cuda:0, cuda:0: 2 ranks share 1 GPU"),
    (device_per_rank_guard, f"{SHORT}, the ranks chose cuda:0, cpu: a GPU for some, the CPU "
                            "for others, and NCCL needs a GPU on every rank"),
    (device_first_gpu, "every rank chose cuda:0"),
    (device_global_rank, "ranks 2 and 3 chose cuda:2 and cuda:3"),
    (device_dist_rank, "that is the global RANK"),
    (device_by_backend, "every rank chose the CPU"),
    (device_world_size_guard, "(the ranks on this machine, not WORLD_SIZE)"),
    (device_as_number, "which is not a device"),
    (device_rank_mod_two, "on 1 machine with 3 GPUs (ranks 0, 1 and 2), the GPU number repeats "
                          "every 2 ranks"),
])
def test_pick_device_rejects(fn, hint, capsys):
    rejects(check_pick_device, fn, hint, capsys)


# -- to_device ------------------------------------------------------------------------------

def to_device_in_one_line(model, loss_fn, x, y, device):
    return model.to(device), loss_fn.to(device), *(t.to(device) for t in (x, y))


def to_device_copies_dropped(model, loss_fn, x, y, device):
    model.to(device)
    loss_fn.to(device)
    x.to(device)
    y.to(device)
    return model, loss_fn, x, y


def to_device_loss_left(model, loss_fn, x, y, device):
    return model.to(device), loss_fn, x.to(device), y.to(device)


def to_device_targets_left(model, loss_fn, x, y, device):
    return model.to(device), loss_fn.to(device), x.to(device), y


def to_device_model_only(model, loss_fn, x, y, device):
    return model.to(device)


def to_device_new_loss(model, loss_fn, x, y, device):
    return model.to(device), nn.CrossEntropyLoss(), x.to(device), y.to(device)


def to_device_new_model(model, loss_fn, x, y, device):
    fresh = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    return fresh.to(device), loss_fn.to(device), x.to(device), y.to(device)


def to_device_new_batch(model, loss_fn, x, y, device):
    return (model.to(device), loss_fn.to(device), torch.randn(16, 6, device=device),
            y.to(device))


def to_device_loss_rebuilt(model, loss_fn, x, y, device):
    weighted = nn.CrossEntropyLoss(weight=loss_fn.weight.to(device))
    return model.to(device), weighted, x.to(device), y.to(device)


def to_device_reads_labels(model, loss_fn, x, y, device):  # finished; reads values on meta
    model, loss_fn, x, y = model.to(device), loss_fn.to(device), x.to(device), y.to(device)
    print("classes in this batch:", sorted(set(y.tolist())))
    return model, loss_fn, x, y


def to_device_drops_empty_rows(model, loss_fn, x, y, device):  # finished; x[mask] on meta
    x, y = x.to(device), y.to(device)
    keep = x.abs().sum(1) > 0
    return model.to(device), loss_fn.to(device), x[keep], y[keep]


@pytest.mark.parametrize("fn", ["solution", to_device_in_one_line, to_device_loss_rebuilt])
def test_to_device_accepts(fn, capsys):
    accepts(check_to_device, solution("to_device") if fn == "solution" else fn, capsys)


@pytest.mark.parametrize("fn, hint", [
    (to_device_copies_dropped, "rank 0: inputs on cpu, not on meta: a tensor's .to() returns"),
    (to_device_loss_left, "loss_fn buffers on cpu, not on meta: the loss's class weight"),
    (to_device_targets_left, "targets on cpu, not on meta"),
    (to_device_model_only, "return the four things it was given"),
    (to_device_new_loss, "it has no class weight: a new nn.CrossEntropyLoss()"),
    (to_device_new_model, "the model to_device() returned is not the one it was given"),
    (to_device_new_batch, "the x to_device() returned holds other values"),
    # torch's NotImplementedError on the meta device is no stub (review M10)
    (to_device_reads_labels, "read values out of a tensor on the meta device"),
    (to_device_drops_empty_rows, "read values out of a tensor on the meta device"),
])
def test_to_device_rejects(fn, hint, capsys):
    rejects(check_to_device, fn, hint, capsys)
