"""Checks that a pencil (A, M) is one the solver's theory covers: real, finite, symmetric A and
M, M positive definite.

The filtered Lanczos method of pEVSL (Shi, Li, Xi, Saad, de Hoop, SC'18, section IV; Li, Xi,
Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 3) computes eigenpairs of a
symmetric-definite pencil; on anything else it returns numbers that mean nothing (a
non-symmetric A once gave zero eigenvalues and "converged"). These checks run before any
solve: element-wise ones here, the definiteness certificates in `furnace.eigen.inertia`
(sparse LDL^T of M) and `furnace.eigen.operators.scale_pencil` (Lanczos on the scaled M).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# |X - X^T| <= SYMMETRY_RTOL * max |X| entry by entry: rounding in assembly (a Schur complement,
# a Matrix Market round trip) stays far below it, a genuinely non-symmetric matrix far above
SYMMETRY_RTOL = 1e-10


class PencilError(ValueError):
    """A or M is not a real, finite, symmetric matrix with M positive definite.

    Attributes:
        matrix: "A" or "M", the matrix at fault (the CLI maps it to its argument).
    """

    def __init__(self, matrix: str, message: str) -> None:
        self.matrix = matrix
        super().__init__(message)


def _shape(op, name: str) -> tuple[int, int]:
    shape = getattr(op, "shape", None)
    if shape is None or len(shape) != 2:
        raise PencilError(name, f"{name} must be a 2-D matrix or LinearOperator, got "
                          f"{type(op).__name__}")
    return int(shape[0]), int(shape[1])


def _entries(op) -> np.ndarray | None:
    """The stored entries of a sparse or dense matrix; None for a LinearOperator."""
    if sp.issparse(op):
        return op.data
    if isinstance(op, np.ndarray):
        return op
    return None


def _check_real_finite(op, name: str) -> None:
    data = _entries(op)
    dtype = getattr(op, "dtype", None)
    if dtype is not None and np.issubdtype(np.dtype(dtype), np.complexfloating):
        raise PencilError(name, f"{name} has complex entries; the solver needs a real "
                          "symmetric matrix")
    if data is not None and data.size and not np.all(np.isfinite(data)):
        bad = int(np.count_nonzero(~np.isfinite(data)))
        raise PencilError(name, f"{name} has {bad} non-finite entries (NaN or Inf)")


def _check_symmetric(op, name: str, rtol: float) -> None:
    if sp.issparse(op) or isinstance(op, np.ndarray):
        matrix = sp.csr_matrix(op)
        peak = float(abs(matrix).max()) if matrix.nnz else 0.0
        gap = abs(matrix - matrix.T)
        worst = float(gap.max()) if gap.nnz else 0.0
        if worst > rtol * peak:
            raise PencilError(name, f"{name} is not symmetric: max |{name} - {name}^T| = "
                              f"{worst:.3g} against max |{name}| = {peak:.3g} (relative "
                              f"tolerance {rtol:g})")
        return
    # a LinearOperator: x^T (A y) = y^T (A x) for random x, y, up to rounding
    rng = np.random.default_rng(12345)
    n = op.shape[0]
    x, y = rng.standard_normal(n), rng.standard_normal(n)
    ax, ay = np.asarray(op @ x, dtype=float).ravel(), np.asarray(op @ y, dtype=float).ravel()
    if not (np.all(np.isfinite(ax)) and np.all(np.isfinite(ay))):
        raise PencilError(name, f"{name} gives non-finite products (NaN or Inf entries)")
    worst = abs(float(x @ ay) - float(y @ ax))
    scale = float(np.linalg.norm(x) * np.linalg.norm(ay) + np.linalg.norm(y) * np.linalg.norm(ax))
    if worst > rtol * scale:
        raise PencilError(name, f"{name} is not symmetric: |x^T {name} y - y^T {name} x| = "
                          f"{worst:.3g} for random x, y, against {scale:.3g} (relative "
                          f"tolerance {rtol:g})")


def mass_diagonal(M) -> np.ndarray:
    """The diagonal of M (probed for a LinearOperator)."""
    from furnace.eigen.operators import operator_diagonal

    return operator_diagonal(M)


def check_pencil(A, M, *, mass: str = "consistent", rtol: float = SYMMETRY_RTOL) -> int:
    """Raise `PencilError` unless (A, M) is real, finite, square, symmetric, with a positive
    diagonal of M (row sums for mass="lumped"); return n.

    Positive diagonal entries are necessary for M to be positive definite, not sufficient:
    `furnace.eigen.inertia.check_mass_definite` (sparse LDL^T) and the Lanczos estimate in
    `scale_pencil` certify the rest.
    """
    rows, cols = _shape(A, "A")
    if rows != cols:
        raise PencilError("A", f"A must be square, got shape {rows} x {cols}")
    if rows == 0:
        raise PencilError("A", "A is empty (0 x 0)")
    _check_real_finite(A, "A")
    if M is not None:
        shape = _shape(M, "M")
        if shape != (rows, cols):
            raise PencilError("M", f"M has shape {shape[0]} x {shape[1]}, A has {rows} x {cols}")
        _check_real_finite(M, "M")
    _check_symmetric(A, "A", rtol)
    if M is None:
        return rows
    _check_symmetric(M, "M", rtol)
    diag = mass_diagonal(M)
    if not np.all(diag > 0):
        where = int(np.flatnonzero(~(diag > 0))[0])
        raise PencilError("M", f"M is not positive definite: its diagonal must be positive, "
                          f"got {diag[where]:g} at row {where}")
    if mass == "lumped":
        from furnace.eigen.operators import row_sums

        sums = row_sums(M)
        if not np.all(sums > 0):
            where = int(np.flatnonzero(~(sums > 0))[0])
            raise PencilError("M", f"the lumped M (row sums) must be positive, got "
                              f"{sums[where]:g} at row {where}")
    return rows
