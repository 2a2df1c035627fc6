"""Tests of the damped Chebyshev delta filter (pEVSL FindPol; EVSL, SISC 2019, section 3.1)."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.eigen import damping_factors, find_polynomial


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damping", ["sigma", "jackson"])
@pytest.mark.parametrize(
    "a, b",
    [(0.9, 1.2), (1.81, 2.01), (5.0, 5.7), (9.5, 10.8)],
    ids=["low", "low-narrow", "middle", "high"],
)
def test_find_polynomial_design(a, b, damping):
    lmin, lmax = 0.1, 11.0
    poly = find_polynomial(a, b, lmin, lmax, damping=damping)
    assert poly.kind == "interior"
    assert poly(poly.peak) == pytest.approx(1.0, abs=1e-12)
    assert poly(a) == pytest.approx(poly.bar, abs=1e-10)
    assert poly(b) == pytest.approx(poly.bar, abs=1e-10)
    assert 0.0 < poly.bar <= 0.8
    grid = np.linspace(lmin, lmax, 20001)
    values = poly(grid)
    outside = (grid < a) | (grid > b)
    # 1e-12 absorbs rounding of the series next to a and b where p crosses bar
    assert np.max(np.abs(values[outside])) <= poly.bar + 1e-12
    assert np.min(values[~outside]) >= poly.bar - 1e-12
    # the degree is the smallest reaching the threshold: one less must miss it
    if poly.degree > 2:
        with pytest.raises(ValueError, match="no filter"):
            find_polynomial(a, b, lmin, lmax, damping=damping, max_degree=poly.degree - 1)


@pytest.mark.timeout(120)
def test_find_polynomial_end_intervals():
    lower = find_polynomial(-1.0, 1.0, 0.0, 10.0, thresh_ext=0.7)
    assert lower.kind == "lower"
    assert lower(0.0) == pytest.approx(1.0)
    assert lower(1.0) == pytest.approx(lower.bar) and lower.bar <= 0.7
    grid = np.linspace(0.0, 10.0, 5001)
    assert np.all(lower(grid[grid <= 1.0]) >= lower.bar - 1e-12)
    assert np.all(np.abs(lower(grid[grid > 1.0])) <= lower.bar + 1e-12)
    upper = find_polynomial(9.0, 12.0, 0.0, 10.0)
    assert upper.kind == "upper"
    assert upper(10.0) == pytest.approx(1.0)
    assert upper(9.0) == pytest.approx(upper.bar)


@pytest.mark.timeout(120)
def test_filter_apply_matches_scalar_evaluation():
    rng = np.random.default_rng(42)
    eigenvalues = np.sort(rng.uniform(0.0, 4.0, 57))
    poly = find_polynomial(1.3, 1.6, 0.0, 4.0)
    vector = rng.standard_normal(57)
    applied = poly.apply(lambda x: eigenvalues * x, vector)
    np.testing.assert_allclose(applied, poly(eigenvalues) * vector, rtol=1e-10, atol=1e-12)


@pytest.mark.timeout(120)
def test_damping_factors():
    assert damping_factors(10, "sigma")[0] == 1.0
    assert damping_factors(10, "jackson")[0] == pytest.approx(1.0)
    assert np.all(np.diff(damping_factors(10, "sigma")) < 0)
    with pytest.raises(ValueError, match="damping"):
        damping_factors(10, "lanczos")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "a, b, lmin, lmax, match",
    [
        (2.0, 1.0, 0.0, 4.0, "a < b"),
        (5.0, 6.0, 0.0, 4.0, "outside"),
        (-1.0, 5.0, 0.0, 4.0, "whole spectrum"),
        (1.0, 2.0, 4.0, 0.0, "lmin < lmax"),
    ],
)
def test_find_polynomial_errors(a, b, lmin, lmax, match):
    with pytest.raises(ValueError, match=match):
        find_polynomial(a, b, lmin, lmax)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_chebyshev_steps_equal_the_plain_recurrence(threads):
    import scipy.sparse as sp

    from furnace.eigen import Counters, ScaledOperator

    rng = np.random.default_rng(5)
    A = sp.random(300, 300, density=0.03, random_state=6, format="csr")
    A = (A + A.T + sp.identity(300) * 3).tocsr()
    op = ScaledOperator(A, rng.uniform(0.5, 1.5, 300), Counters(), "a_matvecs",
                        threads=threads, thread_min_nnz=0)
    assert op.supports_chebyshev_step
    lmax = float(np.abs(op @ np.eye(300)).sum(axis=0).max())
    poly = find_polynomial(0.5, 1.5, -lmax, lmax)
    op.counters.a_matvecs = 0
    v = rng.standard_normal(300)
    fused = poly.apply(op, v)
    plain = poly.apply(lambda x: op @ x, v)
    np.testing.assert_allclose(fused, plain, rtol=1e-12, atol=1e-12 * np.abs(plain).max())
    assert op.counters.a_matvecs == 2 * poly.degree
