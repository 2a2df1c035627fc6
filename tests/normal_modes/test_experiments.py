"""`furnace reproduce normal_modes`: the planet experiments are registered here, under
normal_modes, and their bookkeeping is right (`furnace.normal_modes.experiments`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from furnace.normal_modes import experiments
from furnace.normal_modes.experiments import LAMB, ball_comparison_pencil, multiplet_errors
from furnace.runtime import reproduce
from furnace.runtime.testing import max_relative_error


def test_registered_under_normal_modes():
    found = reproduce.discover("normal_modes")
    assert [e.name for e in found] == ["lamb", "mars", "vs_arpack_ball"]
    assert {e.system for e in found} == {"normal_modes"}
    assert [e.name for e in found if e.quick] == ["lamb", "mars"]
    assert not hasattr(experiments, "REPORTED_UNDER")
    chosen, missing = reproduce.select(["normal_modes"], quick=True)
    assert [e.name for e in chosen] == ["lamb", "mars"] and missing == []
    # the planets are not eigen's any more
    assert not {"lamb", "mars"} & {e.name for e in reproduce.discover("eigen")}


def test_multiplet_errors_assign_in_order():
    exact = np.concatenate([np.full(m, ref) for _, ref, m in LAMB])
    assert np.allclose(multiplet_errors(exact * 1.01), 0.01)
    # the two l=3 multiplets above the interval: reported as missing, not as errors
    errors = multiplet_errors(exact[:13])
    assert np.allclose(errors[:3], 0.0) and all(math.isnan(e) for e in errors[3:])


@pytest.mark.timeout(60)
def test_ball_comparison_pencil_constraints_are_the_rigid_motions():
    pencil = ball_comparison_pencil(0.35)
    K, rigid = pencil.K, pencil.constraints
    assert rigid.shape == (K.shape[0], 6) and np.linalg.matrix_rank(rigid) == 6
    assert (pencil.a, pencil.b) == experiments.INTERVAL and pencil.exact is None
    # rigid motions store no strain energy: K r = 0 up to rounding at ||K|| ||r||
    scale = abs(K).sum(axis=1).max() * np.abs(rigid).max()
    err = max_relative_error(torch.zeros(K.shape[0], 6), torch.as_tensor(K @ rigid),
                             scale=scale)
    assert err < 1e-12
