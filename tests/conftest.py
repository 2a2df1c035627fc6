"""Shared fixtures for the whole suite.

Every test gets a fixed seed, and `torch.empty`, `torch.empty_like` and `Tensor.new_empty`
return NaN-filled floating tensors in the test process (flash-linear-attention's trick), so
code that reads memory it never wrote fails loudly instead of passing by luck; fast paths
allocate their outputs with all three. Spawned ranks are separate processes and
are not poisoned; the distributed tests compare against references computed here.
"""

from __future__ import annotations

import pytest
import torch

from furnace.runtime.presets import emulated_link
from furnace.runtime.testing import seed_all

_real_empty = torch.empty
_real_empty_like = torch.empty_like
_real_new_empty = torch.Tensor.new_empty


def _poisoned(out: torch.Tensor) -> torch.Tensor:
    if out.is_floating_point() or out.is_complex():
        out.fill_(float("nan"))
    return out


def _nan_empty(*args, **kwargs):
    return _poisoned(_real_empty(*args, **kwargs))


def _nan_empty_like(*args, **kwargs):
    return _poisoned(_real_empty_like(*args, **kwargs))


def _nan_new_empty(self, *args, **kwargs):
    return _poisoned(_real_new_empty(self, *args, **kwargs))


@pytest.fixture(autouse=True)
def _seed_and_poison(monkeypatch):
    seed_all(42)
    monkeypatch.setattr(torch, "empty", _nan_empty)
    monkeypatch.setattr(torch, "empty_like", _nan_empty_like)
    monkeypatch.setattr(torch.Tensor, "new_empty", _nan_new_empty)
    yield


@pytest.fixture
def slow_link():
    """A 1 MB/s, 1 ms link: 1 KB costs 2 ms, so modelled values are easy to hand-compute."""
    return emulated_link(bandwidth_Bps=1e6, latency_s=1e-3)
