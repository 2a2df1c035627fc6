"""Dirichlet Laplacians with their spectrum in closed form, and the intervals the completeness
tests of `furnace.eigen` (pEVSL-style filtered Lanczos; Shi et al., SC'18) solve on them.

A Kronecker sum of 1-D second differences tridiag(-1, 2, -1) on an n_1 x ... x n_d grid has
the eigenvalues sum_i 2 - 2 cos(k_i pi / (n_i + 1)), k_i = 1..n_i; on a square or cube grid
most of them are repeated, the case single-vector Lanczos sees one copy of. Shared by the
serial tests (test_completeness.py) and the MPI driver run under mpiexec (mpi_closed_form.py),
so this module imports neither pytest nor mpi4py.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def kron_sum(factors: list[sp.spmatrix]) -> sp.csr_matrix:
    """sum_i I x ... x F_i x ... x I."""
    sizes = [f.shape[0] for f in factors]
    total = None
    for i, factor in enumerate(factors):
        term = None
        for j, size in enumerate(sizes):
            piece = factor if i == j else sp.identity(size)
            term = piece if term is None else sp.kron(term, piece)
        total = term if total is None else total + term
    return sp.csr_matrix(total)


def dirichlet_laplacian(shape) -> tuple[sp.csr_matrix, np.ndarray]:
    """(A, eigenvalues): the Dirichlet Laplacian on a grid of `shape` (unit spacing) and its
    eigenvalues in closed form, ascending with multiplicity."""
    A = kron_sum([sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n)) for n in shape])
    values = np.zeros(1)
    for n in shape:
        values = np.add.outer(values, 2.0 - 2.0 * np.cos(np.arange(1, n + 1) * np.pi / (n + 1)))
    return A, np.sort(values.ravel())


def cluster_interval(values: np.ndarray, first: int, last: int) -> tuple[float, float, int]:
    """(a, b, count): a and b at midpoints between distinct eigenvalues, so that [a, b] holds
    values[first] .. values[last] and every copy of them; count is how many that is."""
    scale = np.max(np.abs(values))
    distinct = values[np.concatenate([[True], np.diff(values) > 1e-9 * scale])]
    lo = int(np.searchsorted(distinct, values[first] - 1e-9 * scale))
    hi = int(np.searchsorted(distinct, values[last] + 1e-9 * scale)) - 1
    a = 0.5 * (distinct[lo - 1] + distinct[lo]) if lo > 0 else distinct[0] - 1.0
    b = 0.5 * (distinct[hi] + distinct[hi + 1]) if hi + 1 < distinct.size else distinct[-1] + 1.0
    return float(a), float(b), int(np.count_nonzero((values >= a) & (values <= b)))


# (name, grid, first, last): [a, b] holds sorted eigenvalues first..last and all their copies;
# first = 0 puts a below the spectrum, last = -1 puts b above it
CASES = [
    ("narrow-3d", (8, 8, 8), 200, 230),
    ("wide-2d", (24, 24), 20, 555),
    ("lower-end-3d", (8, 8, 8), 0, 25),
    ("upper-end-2d", (20, 20), 370, -1),
    ("whole-3d", (6, 6, 6), 0, -1),
]


def case(name: str) -> tuple[sp.csr_matrix, np.ndarray, float, float]:
    """(A, the eigenvalues in [a, b], a, b) of the named case."""
    grid, first, last = next((g, f, la) for n, g, f, la in CASES if n == name)
    A, values = dirichlet_laplacian(grid)
    a, b, _ = cluster_interval(values, first, values.size - 1 if last == -1 else last)
    return A, values[(values >= a) & (values <= b)], a, b
