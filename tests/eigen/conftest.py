"""Test pencils for furnace.eigen: finite-difference Laplacians with P1-like mass matrices, and
Dirichlet Laplacians with their spectrum in closed form.

The mass is a Kronecker sum of 1-D P1 mass matrices tridiag(1/6, 4/6, 1/6) with random
nodal density weights S M S; Jacobi scaling removes S exactly and leaves a spectrum in
(0.5, 1.5), condition < 3. The random weights break the grid symmetries, so no eigenvalue
is repeated (single-vector Lanczos finds one vector per eigenspace in exact arithmetic).

`dirichlet_laplacian` keeps them: on a square or cube grid most eigenvalues are repeated
(lambda_(i,j) = lambda_(j,i)), the case a solver that trusts one Lanczos vector gets wrong.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg

from .closed_form import cluster_interval, dirichlet_laplacian, kron_sum  # noqa: F401


def _second_difference(num: int, spacing: float) -> sp.csr_matrix:
    return sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(num, num)) / spacing**2


def _p1_mass(num: int) -> sp.csr_matrix:
    return sp.diags([1.0 / 6.0, 4.0 / 6.0, 1.0 / 6.0], [-1, 0, 1], shape=(num, num))


def laplacian_pencil(shape, spacings, seed: int = 42):
    """(A, M): FD Laplacian and weighted Kronecker-sum P1 mass on a grid of `shape`."""
    rng = np.random.default_rng(seed)
    A = kron_sum([_second_difference(n, h) for n, h in zip(shape, spacings)])
    mass = kron_sum([_p1_mass(n) for n in shape]) / len(shape)
    weights = sp.diags(rng.uniform(0.8, 1.25, size=A.shape[0]))
    M = sp.csr_matrix(weights @ mass @ weights)
    return A, M


def gap_interval(values: np.ndarray, first: int, count: int) -> tuple[float, float]:
    """[a, b] holding values[first:first + count], with a and b at gap midpoints."""
    a = 0.5 * (values[first - 1] + values[first]) if first > 0 else values[0] - 1.0
    b = 0.5 * (values[first + count - 1] + values[first + count])
    return float(a), float(b)


@pytest.fixture(scope="session")
def pencil_3d():
    """12 x 12 x 12 grid (n = 1728), unequal spacings, and its lowest 120 eigenvalues.

    The values come from shift-invert ARPACK (cheap 3-D LU at this size); the dense
    reference is checked against them in test_eigsh_interval_3d_matches_naive.
    """
    A, M = laplacian_pencil((12, 12, 12), (1.0, 1.1, 1.3))
    return A, M, lowest_eigenvalues(A, M, 120)


@pytest.fixture(scope="session")
def pencil_2d():
    """60 x 58 grid (n = 3480), and its lowest 60 eigenvalues by shift-invert ARPACK.

    Dense eigh of n = 3480 takes ~15 s on two cores; the 2-D LU is cheap and exact enough.
    """
    A, M = laplacian_pencil((60, 58), (1.0, 1.2), seed=7)
    return A, M, lowest_eigenvalues(A, M, 60)


@pytest.fixture(scope="session")
def lumped_3d(pencil_3d):
    """The 3-D pencil with row-sum lumped mass, and its lowest 120 eigenvalues."""
    A, M, _ = pencil_3d
    lumped = sp.diags(np.asarray(M.sum(axis=1)).ravel()).tocsr()
    return A, lumped, lowest_eigenvalues(A, lumped, 120)


def lowest_eigenvalues(A, M, count: int) -> np.ndarray:
    values = scipy.sparse.linalg.eigsh(
        A.tocsc(),
        k=count,
        M=M.tocsc(),
        sigma=-1.0,
        which="LM",
        tol=0.0,
        v0=np.random.default_rng(0).standard_normal(A.shape[0]),
        return_eigenvectors=False,
    )
    return np.sort(values)


def tet_p1_mass(cells: int) -> sp.csr_matrix:
    """Consistent P1 mass on a Kuhn (6 tets per cube) mesh of the unit cube.

    Its Jacobi-scaled spectrum lies in Wathen's [1/2, 5/2] (condition <= 5), the case the
    design's degree-25 Chebyshev mass solve is sized for.
    """
    nodes = cells + 1
    volume = (1.0 / cells) ** 3 / 6.0
    element = volume / 20.0 * (np.ones((4, 4)) + np.eye(4))
    corner = np.array(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij")).reshape(3, -1).T
    rows, cols, vals = [], [], []
    for perm in itertools.permutations(range(3)):
        path = [np.zeros(3, dtype=int)]
        for axis in perm:
            step = path[-1].copy()
            step[axis] += 1
            path.append(step)
        ids = np.stack(
            [((corner + p) * [nodes * nodes, nodes, 1]).sum(axis=1) for p in path], axis=1
        )
        for i in range(4):
            for j in range(4):
                rows.append(ids[:, i])
                cols.append(ids[:, j])
                vals.append(np.full(ids.shape[0], element[i, j]))
    size = nodes**3
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size)
    )


def assert_values_close(name: str, reference, actual, ratio: float, scale: float) -> None:
    """max |actual - reference| <= ratio * max(max |reference|, scale), entry by entry.

    `scale` is the floor tied to the inputs (the spectrum's or the interval's magnitude), so
    that a reference that happens to be zero (an eigenvalue at 0, an empty array) still
    gives the tolerance a meaning (`furnace.runtime.testing.max_relative_error`).
    """
    import torch

    from furnace.runtime.testing import max_relative_error

    reference = np.asarray(reference, dtype=float)
    actual = np.asarray(actual, dtype=float)
    assert reference.shape == actual.shape, f"{name}: shapes {reference.shape} != {actual.shape}"
    if reference.size == 0:
        return
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values"
    error = max_relative_error(torch.from_numpy(reference), torch.from_numpy(actual), scale=scale)
    assert error <= ratio, f"{name}: max relative error {error:.3e} exceeds {ratio:.1e}"
