"""Sylvester inertia of A - sigma M: the exact number of eigenvalues of the pencil below sigma.

For symmetric A and symmetric positive definite M, the number of eigenvalues of A x = lambda M x
below sigma equals the number of negative eigenvalues of A - sigma M (Sylvester's law of
inertia), which an LDL^T factorisation P (A - sigma M) P^T = L D L^T reads off as the number
of negative pivots in D (Parlett, *The Symmetric Eigenvalue Problem*, 1998, section 3.3;
Grimes, Lewis, Simon, "A shifted block Lanczos algorithm", SIAM J. Matrix Anal. Appl. 15,
1994, section 3, use the same count to certify spectrum slices). EVSL and pEVSL rely on the
KPM estimate alone (Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 2);
this module is what lets `eigsh_interval` vouch for an exact count where a factorisation is
affordable.

The sparse factorisation is SuperLU with a symmetric ordering and diagonal pivots only
(``SymmetricMode``, ``diag_pivot_thresh=0``), so L U is L (D L^T). Without off-diagonal pivots
an indefinite LDL^T is not backward stable in general: a factor whose measured backward error
exceeds `BACKWARD_LIMIT`, or whose pivots left the diagonal, is not trusted. For small n the
dense Bunch-Kaufman LDL^T of LAPACK (backward stable) takes its place; otherwise the shift is
moved outward a little (the caller widens its acceptance window to match) and tried again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from furnace.eigen.checks import PencilError
from furnace.eigen.filters import Operator
from furnace.eigen.operators import is_diagonal, row_sums

# ||L U - P S P^T||_2 / ||S||_1 above this: the pivot signs are the inertia of a matrix too far
# from S to count eigenvalues within the boundary margin (tests/eigen/test_completeness.py
# checks a good factor of a 3-D Laplacian far below it and a broken one above 1e-3)
BACKWARD_LIMIT = 1e-10
# power-iteration steps that estimate ||L U - P S P^T||_2
BACKWARD_STEPS = 4
# up to this n the dense Bunch-Kaufman factorisation (n^3 / 3 flops) is a cheap fallback
DENSE_LIMIT = 2000
# shifts tried at the outer ends of an interval, relative to the spectrum's magnitude, moved
# outward: far enough from an eigenvalue sitting exactly on the end (a Laplacian's integer
# eigenvalues) that rounding cannot put it on the wrong side, close enough for the filter
END_STEPS = (1e-6, 1e-4)
# shifts tried at a slice boundary inside the interval (0 first: the boundary itself)
INNER_STEPS = (0.0, 1e-6)


def _sparse_negative_pivots(S: sp.csc_matrix) -> int | None:
    """Negative pivots of a symmetric-ordered, diagonally pivoted sparse LU; None if the
    factor cannot be trusted (exactly singular, pivots off the diagonal, large growth)."""
    try:
        lu = sla.splu(S, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                      options={"SymmetricMode": True})
    except RuntimeError:
        return None  # an exactly zero pivot: sigma is an eigenvalue of a leading block
    if not np.array_equal(lu.perm_r, lu.perm_c):
        return None
    pivots = lu.U.diagonal()
    if not np.all(np.isfinite(pivots)):
        return None
    if backward_error(S, lu) > BACKWARD_LIMIT:
        return None
    return int(np.count_nonzero(pivots < 0))


def backward_error(S: sp.csc_matrix, lu: sla.SuperLU) -> float:
    """||E||_2 / ||S||_1 for E = Pr^T L U Pc^T - S, by a few steps of power iteration on E^T E.

    Unpivoted LDL^T of an indefinite matrix is not backward stable in general (Higham,
    Accuracy and Stability of Numerical Algorithms, 2002, section 11.1), so the factor is
    checked after the fact: its pivot signs are the inertia of S + E, whose eigenvalues are
    within ||E||_2 of those of S (Weyl).
    """
    n = S.shape[0]
    rows = sp.csc_matrix((np.ones(n), (lu.perm_r, np.arange(n))), shape=(n, n))
    cols = sp.csc_matrix((np.ones(n), (np.arange(n), lu.perm_c)), shape=(n, n))

    def apply(x: np.ndarray) -> np.ndarray:
        return rows.T @ (lu.L @ (lu.U @ (cols.T @ x))) - S @ x

    def apply_t(y: np.ndarray) -> np.ndarray:
        return cols @ (lu.U.T @ (lu.L.T @ (rows @ y))) - S.T @ y

    v = np.random.default_rng(0).standard_normal(n)
    v /= np.linalg.norm(v)
    estimate = 0.0
    for _ in range(BACKWARD_STEPS):
        w = apply(v)
        estimate = float(np.linalg.norm(w))
        if not estimate > 0.0:
            return 0.0 if estimate == 0.0 else float("inf")
        v = apply_t(w)
        v /= np.linalg.norm(v)
    return estimate / float(abs(S).sum(axis=0).max())


def _dense_negative_eigenvalues(S: Operator) -> int:
    """Negative eigenvalues of a symmetric matrix from LAPACK's Bunch-Kaufman LDL^T."""
    _, blocks, _ = scipy.linalg.ldl(S.toarray() if sp.issparse(S) else S, lower=True)
    # D is block diagonal with 1 x 1 and 2 x 2 blocks, so tridiagonal: its eigenvalues (by
    # the tridiagonal solver, not a dense one) give the inertia
    values = scipy.linalg.eigvalsh_tridiagonal(np.diag(blocks).copy(),
                                               np.diag(blocks, -1).copy())
    return int(np.count_nonzero(values < 0))


@dataclass
class InertiaCount:
    """The number of eigenvalues of the pencil below ``sigma`` (the shift factored, which may
    sit a little outside the one asked for) and how it was obtained."""

    sigma: float
    below: int
    method: str


class InertiaCounter:
    """Counts eigenvalues of (A, M) below shifts by LDL^T of D (A - sigma M) D.

    D = diag(M)^-1/2 is the solver's Jacobi scaling: a congruence, so it keeps the inertia,
    and it makes the matrix entries O(1) for the growth test.

    Args:
        A, M: sparse or dense matrices (M None is the identity); with mass="lumped" M is
            replaced by its row sums, the pencil the solver then solves.
        mass: "consistent" or "lumped".
    """

    def __init__(self, A: Operator, M: Operator | None, *, mass: str = "consistent") -> None:
        self.A = sp.csr_matrix(A, dtype=float)
        n = self.A.shape[0]
        if M is None:
            self.M = sp.identity(n, format="csr")
        elif mass == "lumped":
            self.M = sp.diags(row_sums(M)).tocsr()
        else:
            self.M = sp.csr_matrix(M, dtype=float)
        diag = self.M.diagonal()
        self.scaling = sp.diags(1.0 / np.sqrt(diag)) if np.all(diag > 0) else sp.identity(n)
        self.n = n
        self.factorizations = 0

    def _negative(self, sigma: float) -> tuple[int | None, str]:
        S = (self.scaling @ (self.A - sigma * self.M) @ self.scaling).tocsc()
        S = (0.5 * (S + S.T)).tocsc()
        self.factorizations += 1
        count = _sparse_negative_pivots(S)
        if count is not None:
            return count, "sparse LDL^T"
        if self.n <= DENSE_LIMIT:
            return _dense_negative_eigenvalues(S), "dense LDL^T (Bunch-Kaufman)"
        return None, ""

    def check_mass(self) -> None:
        """Raise `PencilError` unless M is positive definite (every pivot of LDL^T > 0).

        A negative pivot is a certificate (Sylvester's law): M then has that many negative
        eigenvalues; an exactly singular factor means M is singular.
        """
        if is_diagonal(self.M):
            return  # a positive diagonal (check_pencil saw to that) is positive definite
        scaled = (self.scaling @ self.M @ self.scaling).tocsc()
        try:
            lu = sla.splu(scaled, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                          options={"SymmetricMode": True})
        except RuntimeError:
            raise PencilError("M", "M is not positive definite: it is singular (an exactly "
                              "zero pivot in its LDL^T factorisation)") from None
        pivots = lu.U.diagonal()
        if np.array_equal(lu.perm_r, lu.perm_c) and np.all(pivots > 0):
            return
        if self.n <= DENSE_LIMIT:
            values = scipy.linalg.eigvalsh(scaled.toarray())
            if values[0] > 1e-13 * values[-1]:
                return  # the sparse factor was not trusted, but M is positive definite
            raise PencilError("M", f"M is not positive definite: its smallest eigenvalue "
                              f"after Jacobi scaling is {values[0]:.3g}")
        if not np.array_equal(lu.perm_r, lu.perm_c):
            raise PencilError("M", "M is not positive definite: its LDL^T factorisation met "
                              "a zero pivot")
        raise PencilError("M", f"M is not positive definite: "
                          f"{int(np.count_nonzero(pivots <= 0))} non-positive pivots in its "
                          "LDL^T factorisation (Sylvester's law: as many eigenvalues <= 0)")

    def count_below(self, sigma: float, *, scale: float, outward: float = -1.0,
                    steps: tuple[float, ...] = INNER_STEPS) -> InertiaCount | None:
        """Eigenvalues below a shift near sigma, or None if no trusted factorisation was found.

        Args:
            scale: the spectrum's magnitude; the shifts tried are
                sigma + outward * step * scale for each of ``steps``, in order.
            outward: -1 to move a lower end down, +1 to move an upper end up.
            steps: `END_STEPS` for the ends of an interval, `INNER_STEPS` inside it.
        """
        for step in steps:
            shift = float(sigma + outward * step * scale)
            count, method = self._negative(shift)
            if count is not None:
                return InertiaCount(shift, count, method)
        return None
