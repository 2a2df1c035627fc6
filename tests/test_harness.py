"""The suite's own harness (tests/conftest.py): the NaN poison covers every allocator the
fast paths use, so a kernel that reads memory it never wrote fails instead of passing by
luck, and integer allocations are left alone."""

from __future__ import annotations

import torch


def test_uninitialised_floating_memory_is_nan():
    like = torch.zeros(3, 2, dtype=torch.float64)
    assert torch.isnan(torch.empty(4)).all()
    assert torch.isnan(torch.empty_like(like)).all()
    assert torch.isnan(like.new_empty((5,))).all()
    assert torch.isnan(torch.empty_like(torch.zeros(2, dtype=torch.complex64))).all()
    assert torch.empty_like(like).dtype == torch.float64
    assert like.new_empty((5,)).shape == (5,)


def test_integer_allocations_still_work():
    # NaN has no integer value: the poison must leave integer tensors alone, not raise
    ints = torch.zeros(3, dtype=torch.int64)
    assert torch.empty_like(ints).dtype == torch.int64
    assert ints.new_empty((2,)).dtype == torch.int64
