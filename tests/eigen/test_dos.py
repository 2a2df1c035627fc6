"""Tests of the KPM density of states and equal-count slicing (EVSL kpmdos/spslicer)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from furnace.eigen import SolverConfig, estimate_dos, slice_spectrum

from .closed_form import dirichlet_laplacian
from .conftest import gap_interval, laplacian_pencil


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


@pytest.mark.timeout(120)
def test_count_tolerance_covers_the_true_count():
    # random intervals (a third of them narrow) on spectra with many repeated eigenvalues
    # (closed form: jumps of a dozen copies at one point) and on one without; the stated
    # tolerance must cover |estimate - true count| every time
    rng = np.random.default_rng(1)
    A3, cube = dirichlet_laplacian((10, 10, 10))
    A2, square = dirichlet_laplacian((30, 30))
    A, M = laplacian_pencil((9, 9, 9), (1.0, 1.1, 1.3), seed=4)
    weighted = scipy.linalg.eigh(A.toarray(), M.toarray(), eigvals_only=True)
    worst = 0.0
    for matrix, mass, values in ((A3, None, cube), (A2, None, square), (A, M, weighted)):
        dos, _ = estimate_dos(matrix, mass, config=SolverConfig(a=0.0, b=1.0))
        width = dos.lmax - dos.lmin
        for trial in range(150):
            lo, hi = np.sort(rng.uniform(dos.lmin - 0.05 * width, dos.lmax, 2))
            if trial % 3 == 0:
                hi = lo + rng.uniform(0.001, 0.05) * width
            true = np.count_nonzero((values >= lo) & (values <= hi))
            error = abs(dos.count(lo, hi) - true)
            worst = max(worst, error / dos.count_tolerance(lo, hi))
    assert worst <= 1.0, worst


@pytest.mark.timeout(60)
def test_count_tolerance_catches_the_issue_case():
    # a solve of a wide interval of a 3-D Laplacian that returned 611 of 989 eigenvalues: the
    # same fraction found here must fall outside the estimate's tolerance
    A, values = dirichlet_laplacian((10, 10, 10))
    a, b = 1.0, 11.0
    true = np.count_nonzero((values >= a) & (values <= b))
    dos, _ = estimate_dos(A, None, config=SolverConfig(a=a, b=b))
    assert dos.count(a, b) - dos.count_tolerance(a, b) > true * 611 / 989
    assert abs(dos.count(a, b) - true) <= dos.count_tolerance(a, b)
