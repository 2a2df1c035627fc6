"""Tests of the KPM density of states and equal-count slicing (EVSL kpmdos/spslicer)."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.eigen import SolverConfig, estimate_dos, slice_spectrum

from .conftest import gap_interval


@pytest.mark.timeout(120)
def test_kpm_dos_integrates_to_n(lumped_3d, pencil_3d):
    A, _, _ = lumped_3d
    _, M, _ = pencil_3d
    dos, counters = estimate_dos(A, M, config=SolverConfig(a=0.0, b=1.0, mass="lumped"))
    n = A.shape[0]
    assert dos.size == pytest.approx(n)
    assert dos.count(dos.lmin, dos.lmax) == pytest.approx(n, rel=1e-3)
    grid = np.linspace(dos.lmin, dos.lmax, 4001)
    density = dos(grid[1:-1])
    # trapezoid rule on the density agrees with the closed-form integral (Jackson keeps it
    # nearly non-negative)
    assert np.trapezoid(density, grid[1:-1]) == pytest.approx(n, rel=0.05)
    assert density.min() > -0.02 * density.max()
    # 100 KPM steps on 30 probes, plus the bound estimation
    assert counters.a_matvecs >= 30 * 100


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mass", ["lumped", "consistent"])
def test_slice_spectrum_equal_counts(lumped_3d, pencil_3d, mass):
    A, _, lumped_values = lumped_3d
    _, M, consistent_values = pencil_3d
    values = lumped_values if mass == "lumped" else consistent_values
    a, b = gap_interval(values, 40, 60)
    config = SolverConfig(a=a, b=b, mass=mass, cheb_mass_degree=15)
    dos, _ = estimate_dos(A, M, config=config, degree=100, num_vectors=30)
    bounds = slice_spectrum(dos, a, b, 3)
    assert bounds[0] == a and bounds[-1] == b and np.all(np.diff(bounds) > 0)
    counts = [np.sum((values >= lo) & (values < hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert sum(counts) == 60
    # KPM at degree 100 resolves counts to a few eigenvalues: each slice holds 20 +- 6
    assert all(14 <= c <= 26 for c in counts), counts


@pytest.mark.timeout(120)
def test_slice_spectrum_errors(lumped_3d, pencil_3d):
    A, _, _ = lumped_3d
    _, M, _ = pencil_3d
    dos, _ = estimate_dos(A, M, config=SolverConfig(a=0.0, b=1.0, mass="lumped"), degree=20)
    with pytest.raises(ValueError, match="a < b"):
        slice_spectrum(dos, 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="num_slices"):
        slice_spectrum(dos, 0.0, 1.0, 0)
