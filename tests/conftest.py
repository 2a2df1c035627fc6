"""Shared fixtures for the whole suite.

Every test gets a fixed seed, and `torch.empty` returns NaN-filled floating tensors in
the test process (flash-linear-attention's trick), so code that reads memory it never
wrote fails loudly instead of passing by luck. Spawned ranks are separate processes and
are not poisoned; the distributed tests compare against references computed here.
"""

from __future__ import annotations

import pytest
import torch

from furnace.runtime.presets import emulated_link
from furnace.runtime.testing import seed_all

_real_empty = torch.empty


def _nan_empty(*args, **kwargs):
    out = _real_empty(*args, **kwargs)
    if out.is_floating_point() or out.is_complex():
        out.fill_(float("nan"))
    return out


@pytest.fixture(autouse=True)
def _seed_and_poison(monkeypatch):
    seed_all(42)
    monkeypatch.setattr(torch, "empty", _nan_empty)
    yield


@pytest.fixture
def slow_link():
    """A 1 MB/s, 1 ms link: 1 KB costs 2 ms, so modelled values are easy to hand-compute."""
    return emulated_link(bandwidth_Bps=1e6, latency_s=1e-3)
