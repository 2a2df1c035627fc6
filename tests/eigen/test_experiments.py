"""The `furnace reproduce eigen` entries are registered and their bookkeeping is right."""

from __future__ import annotations

import math

import numpy as np

from furnace.eigen.experiments import LAMB, _multiplet_errors
from furnace.runtime.reproduce import discover


def test_registered():
    assert [e.name for e in discover("eigen")] == ["lamb", "vs_arpack", "mars", "scaling",
                                                   "sc18_model"]


def test_multiplet_errors_assign_in_order():
    exact = np.concatenate([np.full(m, ref) for _, ref, m in LAMB])
    assert np.allclose(_multiplet_errors(exact * 1.01), 0.01)
    # the two l=3 multiplets above the interval: reported as missing, not as errors
    errors = _multiplet_errors(exact[:13])
    assert np.allclose(errors[:3], 0.0) and all(math.isnan(e) for e in errors[3:])
