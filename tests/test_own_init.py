"""Code that initialises its own process group, as PyTorch's tutorials and torchrun scripts
do, runs unchanged under launch (course_lib/launching/own_init.py)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from course_lib import DistributedError, launch


# -- PyTorch's DDP tutorial (ddp_tutorial.rst, "Basic Use Case"), adapted to CPU/gloo:
# no .to(rank), no device_ids. setup() and cleanup() are the tutorial's own.
def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    weights = [p.detach().clone() for p in model.parameters()]
    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")
    return weights


def tutorial_main():
    """What mp.spawn would call demo_basic with, read from torchrun's variables."""
    return demo_basic(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def torchrun_script():
    """The torchrun style: env:// rendezvous, no arguments."""
    dist.init_process_group(backend="gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def test_tutorial_demo_basic_runs_unchanged_and_trains_in_sync():
    run = launch(tutorial_main, 3, backend="gloo", echo=False)
    first = run.results[0]
    for weights in run.results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, weights))  # DDP kept them equal
    out = run.output()
    assert "Finished running basic DDP example on rank 2." in out
    assert out.count("course_lib: init_process_group() kept the launch's process group") == 1


def test_torchrun_style_script_runs_on_the_launch_rendezvous():
    assert launch(torchrun_script, 2, backend="gloo", echo=False).results == [3.0, 3.0]


def test_function_that_does_not_initialise_still_finds_the_group():
    def plain():
        return dist.get_world_size()

    assert launch(plain, 2, backend="gloo", echo=False).results == [2, 2]


def _init_again(**kwargs):
    dist.init_process_group(**kwargs)
    return dist.get_backend()


@pytest.mark.parametrize("kwargs, says", [
    ({"backend": "gloo", "world_size": 4}, "launch with world_size=4"),
    ({"backend": "gloo", "rank": 0, "world_size": 2}, "read the rank inside the function"),
    ({"backend": "nccl"}, "needs one GPU per rank"),
])
def test_incompatible_request_says_what_to_change(kwargs, says):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs NCCL needs")
    with pytest.raises(DistributedError) as info:
        launch(_init_again, 2, kwargs=kwargs, backend="gloo", timeout=20, echo=False)
    root = info.value.failures[0]
    assert says in root.message
    assert "distributed_c10d" not in root.traceback  # our message, not torch's internals


def test_asking_for_the_launch_backend_again_after_destroy_starts_a_new_group():
    def twice():
        dist.destroy_process_group()
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    assert launch(twice, 2, backend="gloo", echo=False).results == [2.0, 2.0]


def _loader_start_method():
    import multiprocessing

    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(8)), batch_size=4, num_workers=2)
    batches = [b.tolist() for b in loader]
    return multiprocessing.get_start_method(), batches


def test_dataloader_workers_start_as_under_torchrun():
    """A rank's DataLoader workers use the platform's default start method (fork on Linux),
    not the launcher's forkserver, which would import torch again for every loader."""
    import multiprocessing

    default = multiprocessing.get_context().get_start_method()
    run = launch(_loader_start_method, 2, backend="gloo", echo=False)
    assert run.results == [(default, [[0, 1, 2, 3], [4, 5, 6, 7]])] * 2
