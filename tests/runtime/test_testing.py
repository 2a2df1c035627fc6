"""The shared test helpers."""

from __future__ import annotations

import pytest
import torch

from furnace.runtime.testing import assert_close, relative_error


def test_assert_close():
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(ref, ref + torch.tensor([0.0, 0.05])) == pytest.approx(0.01, rel=1e-5)
    assert_close("x", ref, ref + torch.tensor([0.0, 0.05]), 0.011)
    with pytest.raises(AssertionError, match="relative error 1.000e-02 exceeds 5.0e-03"):
        assert_close("x", ref, ref + torch.tensor([0.0, 0.05]), 0.005)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close("x", ref, torch.tensor([float("nan"), 4.0]), 1.0)
    with pytest.raises(AssertionError, match="shape"):
        assert_close("x", ref, torch.zeros(3), 1.0)


def test_empty_is_poisoned_in_tests():
    # conftest.py makes reads of unwritten memory visible
    assert torch.isnan(torch.empty(3)).all()
