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
