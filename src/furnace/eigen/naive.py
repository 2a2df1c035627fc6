"""Dense reference for `eigsh_interval`: scipy.linalg.eigh on the full pencil.

The slow, exact counterpart of the filtered Lanczos solver (Shi, Li, Xi, Saad, de Hoop, SC'18)
for problems small enough to store densely; it returns the same `EigenResult`.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from furnace.eigen.operators import Counters, check_square


def _dense(X) -> np.ndarray:
    if sp.issparse(X):
        return X.toarray()
    if isinstance(X, np.ndarray):
        return X
    return np.asarray(X @ np.eye(X.shape[0]))


def naive_eigsh_interval(A, M, a: float, b: float):
    """All eigenpairs of A x = lambda M x with lambda in [a, b], by dense eigh.

    Args:
        A, M: (n, n) symmetric, M positive definite (None for the identity).
    Returns:
        `EigenResult` with M-orthonormal eigenvectors and relative residuals.
    """
    from furnace.eigen.solver import EigenResult

    if not a < b:
        raise ValueError(f"need a < b, got a={a}, b={b}")
    n = check_square(A, "A")
    if M is not None and check_square(M, "M") != n:
        raise ValueError(f"A and M must have the same shape, got {A.shape} and {M.shape}")
    dense_a = _dense(A)
    dense_m = np.eye(n) if M is None else _dense(M)
    # the full divide-and-conquer solve beats eigh's value-subset driver (gvx) at n ~ 2000
    values, vectors = scipy.linalg.eigh(dense_a, dense_m)
    inside = (values >= a) & (values <= b)
    values, vectors = values[inside], vectors[:, inside]
    mass_vectors = dense_m @ vectors
    res = np.linalg.norm(dense_a @ vectors - mass_vectors * values, axis=0)
    scale = np.maximum(max(abs(a), abs(b)), np.abs(values))
    residuals = res / (scale * np.maximum(np.linalg.norm(mass_vectors, axis=0), 1e-300))
    # every eigenvalue of the dense pencil is computed, so the count is complete by construction
    return EigenResult(values, vectors, residuals, Counters(), complete=True,
                       expected=float(values.size), count_method="dense")
