"""Tests of Jacobi scaling, the Chebyshev mass solve (Saad, Iterative Methods, p. 399) and
Lanczos bounds."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

from furnace.eigen import ChebyshevMassSolve, Counters, ScaledOperator, lanczos_bounds

from .conftest import assert_values_close, tet_p1_mass


def _scaled_tet_mass(counters):
    mass = tet_p1_mass(8)
    return ScaledOperator(mass, 1.0 / np.sqrt(mass.diagonal()), counters, "m_matvecs")


@pytest.mark.timeout(120)
def test_chebyshev_mass_solve_readme_degree():
    counters = Counters()
    scaled = _scaled_tet_mass(counters)
    # Wathen's bounds for P1 tetrahedra, condition 5: the README's degree 25
    solver = ChebyshevMassSolve(scaled, 0.5, 2.5, 25, counters)
    rhs = np.random.default_rng(42).standard_normal(scaled.shape[0])
    counters.m_matvecs = 0
    x = solver.solve(rhs)
    assert counters.m_matvecs == 25
    assert np.linalg.norm(rhs - scaled @ x) / np.linalg.norm(rhs) <= 1e-9
    assert ChebyshevMassSolve.degree_for(5.0, 1e-9) <= 25


@pytest.mark.timeout(120)
def test_chebyshev_mass_solve_blocks_and_lanczos_bounds():
    counters = Counters()
    scaled = _scaled_tet_mass(counters)
    alpha, beta = lanczos_bounds(scaled, num_steps=100)
    # the exact Jacobi-scaled spectrum is [1/2, 5/2]; the estimate must enclose it loosely
    assert 0.45 <= alpha <= 0.5 + 1e-6 and 2.5 - 1e-6 <= beta <= 2.55
    solver = ChebyshevMassSolve(scaled, alpha, beta, 25, counters)
    rhs = np.random.default_rng(42).standard_normal((scaled.shape[0], 3))
    x = solver.solve(rhs)
    # entry by entry, with the right-hand side's magnitude as the floor (an entry of x may be
    # near 0; the scaled M has its spectrum in [1/2, 5/2], so |x| ~ |rhs|)
    assert_values_close("column", x[:, 1], solver.solve(rhs[:, 1]), 1e-12,
                        float(np.abs(rhs).max()))
    assert np.linalg.norm(rhs - scaled @ x) / np.linalg.norm(rhs) <= 1e-8


@pytest.mark.timeout(120)
def test_scaled_operator_linear_operator_matches_sparse():
    mass = tet_p1_mass(3)
    d = 1.0 / np.sqrt(mass.diagonal())
    x = np.random.default_rng(42).standard_normal(mass.shape[0])
    sparse = ScaledOperator(mass, d, Counters(), "a_matvecs")
    counters = Counters()
    wrapped = ScaledOperator(aslinearoperator(mass), d, counters, "a_matvecs")
    # D M D has a unit diagonal, so |D M D x| ~ |x|: the input's magnitude is the floor
    assert_values_close("product", sparse @ x, wrapped @ x, 1e-13, float(np.abs(x).max()))
    assert counters.a_matvecs == 1
    np.testing.assert_allclose((sp.diags(d) @ mass @ sp.diags(d)).diagonal(), 1.0)


@pytest.mark.timeout(120)
def test_chebyshev_mass_solve_errors():
    with pytest.raises(ValueError, match="alpha < beta"):
        ChebyshevMassSolve(None, 2.0, 1.0, 25, Counters())
    with pytest.raises(ValueError, match="degree"):
        ChebyshevMassSolve(None, 0.5, 2.5, 0, Counters())


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_spmv_equals_plain(threads):
    import scipy.sparse as sp

    from furnace.eigen.operators import Counters, ScaledOperator

    rng = np.random.default_rng(3)
    A = sp.random(200, 200, density=0.05, random_state=4, format="csr")
    A = (A + A.T).tocsr()
    d = rng.uniform(0.5, 2.0, 200)
    plain = ScaledOperator(A, d, Counters(), "a_matvecs")
    counters = Counters()
    threaded = ScaledOperator(A, d, counters, "a_matvecs", threads=threads, thread_min_nnz=0)
    assert len(threaded._blocks) == threads
    for x in (rng.standard_normal(200), rng.standard_normal((200, 3))):
        np.testing.assert_allclose(threaded @ x, plain @ x, rtol=1e-14, atol=1e-14)
    assert counters.a_matvecs == 4
    with pytest.raises(ValueError, match="threads"):
        ScaledOperator(A, d, Counters(), "a_matvecs", threads=0)
