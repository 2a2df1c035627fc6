"""End-to-end tests of eigsh_interval (pEVSL ChebLanNr; Shi et al., SC'18) against dense eigh
and shift-invert ARPACK on finite-difference Laplacian pencils."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

from furnace.eigen import SolverConfig, eigsh_interval, load_pencil, naive_eigsh_interval

from .conftest import assert_values_close, gap_interval, laplacian_pencil

# the eigenvalues come from Rayleigh quotients of converged vectors (error ~ residual^2);
# measured agreement is ~1e-14, so 1e-10 leaves room for BLAS differences
EIG_RTOL = 1e-10


def _check_pairs(result, A, M, reference, tol=1e-10):
    """Same count and values as `reference`, M-orthonormal vectors, small residuals.

    Relative errors are taken against the spectrum's magnitude (the largest |eigenvalue|
    compared) as a floor, never against an eigenvalue alone, which may be 0.
    """
    assert result.complete
    assert result.eigenvalues.size == reference.size
    scale = float(np.max(np.abs(reference))) if reference.size else 1.0
    assert_values_close("eigenvalues", reference, result.eigenvalues, EIG_RTOL, scale)
    x = result.eigenvectors
    gram = x.T @ (M @ x)
    np.testing.assert_allclose(gram, np.eye(x.shape[1]), atol=1e-10)
    residual = np.linalg.norm(A @ x - (M @ x) * result.eigenvalues, axis=0)
    floor = np.maximum(np.abs(result.eigenvalues), scale) * np.linalg.norm(M @ x, axis=0)
    # on the unscaled pencil the residual is looser than on the scaled one by cond(D) ~ 1.6
    assert np.max(residual / floor, initial=0.0) <= 10 * tol
    assert np.max(result.residuals, initial=0.0) <= tol


@pytest.mark.timeout(120)
def test_eigsh_interval_3d_consistent(pencil_3d):
    A, M, values = pencil_3d
    a, b = gap_interval(values, 30, 20)
    result = eigsh_interval(A, M, a, b)
    _check_pairs(result, A, M, values[30:50])
    (info,) = result.slices
    assert info.converged and info.complete and info.filter_kind == "interior"
    assert info.count_method == "inertia" and info.expected == info.num_found == 20
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
    assert_values_close("naive", values[60:72], naive.eigenvalues, 1e-11, float(values[71]))
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
    assert naive.complete and naive.count_method == "dense"


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
    assert_values_close("slices", one.eigenvalues, many.eigenvalues, EIG_RTOL,
                        float(values[84]))
    assert len(many.slices) == num_slices
    assert sum(s.num_found for s in many.slices) == 45
    assert [s.num_found for s in many.slices] == [s.expected for s in many.slices]
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
    # Sylvester's inertia certifies the empty interval: no Lanczos run at all
    assert result.complete and result.expected == 0 and result.counters.lanczos_steps == 0
    dos = eigsh_interval(A, M, 1e3, 2e3, config=SolverConfig(a=1e3, b=2e3, count_check="dos"))
    assert dos.complete and dos.eigenvalues.size == 0 and dos.count_method == "bounds"


@pytest.mark.timeout(120)
def test_eigsh_interval_whole_spectrum():
    # [a, b] around the whole spectrum needs no filter in one slice; it is cut in two or more
    # (the lower and upper end filters) and every eigenvalue comes back
    A, M = laplacian_pencil((6, 5), (1.0, 1.0))
    naive = naive_eigsh_interval(A, M, -1.0, 1e3)
    assert naive.eigenvalues.size == 30
    result = eigsh_interval(A, M, -1.0, 1e3)
    assert len(result.slices) >= 2
    assert {result.slices[0].filter_kind, result.slices[-1].filter_kind} == {"lower", "upper"}
    _check_pairs(result, A, M, naive.eigenvalues)


@pytest.mark.timeout(120)
def test_eigsh_interval_errors():
    A, M = laplacian_pencil((6, 5), (1.0, 1.0))
    with pytest.raises(ValueError, match="a < b"):
        eigsh_interval(A, M, 2.0, 1.0)
    with pytest.raises(ValueError, match="a < b"):
        naive_eigsh_interval(A, M, 1.0, 1.0)
    with pytest.raises(ValueError, match="square"):
        eigsh_interval(sp.random(30, 29, density=0.2, random_state=42), None, 0.0, 1.0)
    with pytest.raises(ValueError, match="M has shape 29 x 29, A has 30 x 30"):
        eigsh_interval(A, sp.identity(29), 0.0, 1.0)
    with pytest.raises(ValueError, match="slices"):
        eigsh_interval(A, M, 0.0, 1.0, slices=0)
    with pytest.raises(ValueError, match="mass"):
        SolverConfig(a=0.0, b=1.0, mass="exact")
    with pytest.raises(ValueError, match="count_check"):
        SolverConfig(a=0.0, b=1.0, count_check="trust")
