"""End-to-end tests of eigsh_interval (pEVSL ChebLanNr; Shi et al., SC'18) against dense eigh
and shift-invert ARPACK on finite-difference Laplacian pencils."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

from furnace.eigen import SolverConfig, eigsh_interval, load_pencil, naive_eigsh_interval

from .conftest import gap_interval, laplacian_pencil

# the eigenvalues come from Rayleigh quotients of converged vectors (error ~ residual^2);
# measured agreement is ~1e-14, so 1e-10 leaves room for BLAS differences
EIG_RTOL = 1e-10


def _check_pairs(result, A, M, reference, tol=1e-10):
    """Same count and values as `reference`, M-orthonormal vectors, small residuals."""
    assert result.eigenvalues.size == reference.size
    np.testing.assert_allclose(result.eigenvalues, reference, rtol=EIG_RTOL)
    x = result.eigenvectors
    gram = x.T @ (M @ x)
    np.testing.assert_allclose(gram, np.eye(x.shape[1]), atol=1e-10)
    residual = np.linalg.norm(A @ x - (M @ x) * result.eigenvalues, axis=0)
    scale = np.maximum(np.abs(result.eigenvalues), 1e-300) * np.linalg.norm(M @ x, axis=0)
    # on the unscaled pencil the residual is looser than on the scaled one by cond(D) ~ 1.6
    assert np.max(residual / scale) <= 10 * tol
    assert np.max(result.residuals) <= tol


@pytest.mark.timeout(120)
def test_eigsh_interval_3d_consistent(pencil_3d):
    A, M, values = pencil_3d
    a, b = gap_interval(values, 30, 20)
    result = eigsh_interval(A, M, a, b)
    _check_pairs(result, A, M, values[30:50])
    (info,) = result.slices
    assert info.converged and info.filter_kind == "interior"
    counters = result.counters
    assert counters.filter_degree == info.degree
    # every filtered matvec costs `degree` A matvecs, each with one 25-step mass solve
    assert counters.a_matvecs >= info.degree * counters.filtered_matvecs
    assert counters.m_matvecs >= 25 * info.degree * counters.filtered_matvecs
    assert counters.lanczos_steps == info.num_steps
    assert counters.peak_basis_bytes >= 2 * 8 * A.shape[0] * info.num_steps
    assert counters.reorth_flops > 0


@pytest.mark.timeout(120)
def test_eigsh_interval_3d_matches_naive(pencil_3d, monkeypatch):
    A, M, values = pencil_3d
    a, b = gap_interval(values, 60, 12)
    naive = naive_eigsh_interval(A, M, a, b)
    np.testing.assert_allclose(naive.eigenvalues, values[60:72], rtol=1e-11)
    result = eigsh_interval(A, M, a, b, config=SolverConfig(a=a, b=b, damping="jackson"))
    _check_pairs(result, A, M, naive.eigenvalues)
    # threaded SpMV changes nothing: threads write disjoint rows
    import furnace.eigen.operators

    monkeypatch.setattr(furnace.eigen.operators, "THREADED_SPMV_MIN_NNZ", 0)
    threaded = eigsh_interval(A, M, a, b, config=SolverConfig(a=a, b=b, damping="jackson",
                                                               threads=2))
    np.testing.assert_array_equal(threaded.eigenvalues, result.eigenvalues)
    # eigenvectors agree with the dense ones up to sign
    overlap = np.abs(np.sum(result.eigenvectors * (M @ naive.eigenvectors), axis=0))
    np.testing.assert_allclose(overlap, 1.0, atol=1e-8)


@pytest.mark.timeout(120)
def test_eigsh_interval_2d_consistent(pencil_2d):
    A, M, values = pencil_2d
    a, b = gap_interval(values, 10, 12)
    result = eigsh_interval(A, M, a, b)
    _check_pairs(result, A, M, values[10:22])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_slices", [2, 3])
def test_eigsh_interval_slices_match_one_slice(lumped_3d, pencil_3d, num_slices):
    A, lumped, values = lumped_3d
    _, M, _ = pencil_3d
    a, b = gap_interval(values, 40, 45)
    config = SolverConfig(a=a, b=b, mass="lumped")
    one = eigsh_interval(A, M, a, b, config=config)
    many = eigsh_interval(A, M, a, b, config=config, slices=num_slices)
    _check_pairs(one, A, lumped, values[40:85])
    _check_pairs(many, A, lumped, values[40:85])
    np.testing.assert_allclose(many.eigenvalues, one.eigenvalues, rtol=EIG_RTOL)
    assert len(many.slices) == num_slices
    assert sum(s.num_found for s in many.slices) == 45
    assert [s.a for s in many.slices[1:]] == [s.b for s in many.slices[:-1]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mass", ["consistent", "lumped"])
def test_eigsh_interval_lower_end(pencil_3d, lumped_3d, mass):
    A, M, values = pencil_3d
    reference_mass = M
    if mass == "lumped":
        _, reference_mass, values = lumped_3d
    b = 0.5 * (values[14] + values[15])
    result = eigsh_interval(A, M, -1.0, b, config=SolverConfig(a=-1.0, b=b, mass=mass))
    assert result.slices[0].filter_kind == "lower"
    _check_pairs(result, A, reference_mass, values[:15])


@pytest.mark.timeout(120)
def test_eigsh_interval_linear_operators_and_standard_problem(tmp_path):
    A, M = laplacian_pencil((14, 13), (1.0, 1.3))
    a, b = 0.5, 1.5
    naive = naive_eigsh_interval(A, M, a, b)
    assert 5 <= naive.eigenvalues.size <= 40
    result = eigsh_interval(aslinearoperator(A), aslinearoperator(M), a, b)
    _check_pairs(result, A, M, naive.eigenvalues)
    scipy.io.mmwrite(tmp_path / "a.mtx", A)
    scipy.io.mmwrite(tmp_path / "m.mtx", M)
    loaded_a, loaded_m = load_pencil(tmp_path / "a.mtx", tmp_path / "m.mtx")
    np.testing.assert_allclose(loaded_a.toarray(), A.toarray())
    standard = eigsh_interval(loaded_a, None, a, b)
    identity = sp.identity(A.shape[0], format="csr")
    _check_pairs(standard, A, identity, naive_eigsh_interval(A, None, a, b).eigenvalues)


@pytest.mark.timeout(120)
def test_eigsh_interval_empty_interval():
    A, M = laplacian_pencil((10, 9), (1.0, 1.0))
    result = eigsh_interval(A, M, 1e3, 2e3)
    assert result.eigenvalues.size == 0 and result.eigenvectors.shape == (90, 0)


@pytest.mark.timeout(120)
def test_eigsh_interval_errors():
    A, M = laplacian_pencil((6, 5), (1.0, 1.0))
    with pytest.raises(ValueError, match="a < b"):
        eigsh_interval(A, M, 2.0, 1.0)
    with pytest.raises(ValueError, match="a < b"):
        naive_eigsh_interval(A, M, 1.0, 1.0)
    with pytest.raises(ValueError, match="square"):
        eigsh_interval(sp.random(30, 29, density=0.2, random_state=42), None, 0.0, 1.0)
    with pytest.raises(ValueError, match="same shape"):
        eigsh_interval(A, sp.identity(29), 0.0, 1.0)
    with pytest.raises(ValueError, match="slices"):
        eigsh_interval(A, M, 0.0, 1.0, slices=0)
    with pytest.raises(ValueError, match="mass"):
        SolverConfig(a=0.0, b=1.0, mass="exact")
    with pytest.raises(ValueError, match="whole spectrum"):
        eigsh_interval(A, M, -1.0, 1e3)
