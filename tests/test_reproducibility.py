"""teach/reproducibility: the checksum sees a one-bit change, largest_gap measures it, and
the pictures draw."""

import torch
from torch import nn

from course_lib.teach.reproducibility import (
    FLOAT32_EPS,
    checksum,
    largest_gap,
    plot_checksums,
    plot_world_size_gaps,
)


def test_checksum_is_equal_only_for_equal_bits():
    a = nn.Linear(3, 2).state_dict()
    b = {k: v.clone() for k, v in a.items()}
    assert checksum(a) == checksum(b) == checksum(b.values())
    b["weight"][0, 0] = torch.nextafter(b["weight"][0, 0], torch.tensor(1.0))  # one float32 step
    assert checksum(a) != checksum(b)
    absolute, relative = largest_gap(b, a)
    assert absolute > 0 and relative <= FLOAT32_EPS


def test_checksum_of_a_module_is_that_of_its_state():
    model = nn.Linear(3, 2)
    assert checksum(model) == checksum(model.state_dict())


def test_pictures_draw():
    fig = plot_checksums({"as written": ["a", "b", "c"], "fixed": ["d", "d", "d"]})
    assert len(fig.axes) == 1
    fig = plot_world_size_gaps({2: 4e-8, 4: 5e-8}, 0.0, steps=4)
    assert len(fig.axes[0].patches) == 3


def test_seeding_seeds_only_what_it_is_told():
    import random

    import numpy as np

    from course_lib.teach.reproducibility import seeding

    def draws():
        return torch.rand(1).item(), random.random(), np.random.rand()

    try:
        seeding(seed_torch=True, seed_numpy=True, deterministic=True)(1)
        first = draws()
        assert torch.are_deterministic_algorithms_enabled()
        seeding(seed_torch=True, seed_numpy=True)(1)
        second = draws()
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    assert first[0] == second[0] and first[2] == second[2]  # seeded: torch, NumPy
    assert first[1] != second[1]  # random was left alone


def test_seeding_explorer_adds_a_row_per_press(monkeypatch):
    from course_lib.teach import reproducibility

    calls, shown = [], []
    monkeypatch.setattr(reproducibility, "plot_checksums", lambda rows: shown.append(dict(rows)))
    monkeypatch.setattr("IPython.display.display", lambda fig: None)

    def checksums(runs, setup, num_workers):
        calls.append((runs, num_workers))
        return ["aaa", "bbb"]

    box = reproducibility.seeding_explorer(checksums, {"as written": ["x", "y", "z"]})
    switches = box.children[0].children
    workers, button = box.children[1].children
    switches[0].value = True  # seed torch
    workers.value = 0
    button.click()
    assert calls == [(2, 0)]
    assert shown[0] == {"as written": ["x", "y", "z"]}  # the static figure first
    assert shown[1]["seed torch; 0 workers"] == ["aaa", "bbb"]
