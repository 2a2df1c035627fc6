"""Test helpers shared by every system's test suite.

`assert_close` compares a fast path against its reference with a relative error
(the norm of the difference over the norm of the reference, as flash-linear-attention's
``assert_close``), so one tolerance means the same thing for every tensor size.
`run_distributed` (from `launch`) is the multi-rank harness.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from .launch import run_distributed

__all__ = ["assert_close", "relative_error", "run_distributed", "seed_all", "start_vector"]


def seed_all(seed: int = 42) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_vector(matrix, seed: int = 0) -> np.ndarray:
    """A fixed random start for ARPACK (`scipy.sparse.linalg.eigsh`'s ``v0``).

    scipy >= 1.15 draws the default start from OS entropy, so a slow run cannot be replayed
    (a test that takes ~5 s once spent over 120 s inside ARPACK in CI).
    """
    return np.random.default_rng(seed).standard_normal(matrix.shape[0])


def relative_error(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """||actual - reference|| / ||reference|| in float64 (absolute error if the reference is 0)."""
    ref = reference.detach().to(torch.float64)
    act = actual.detach().to(torch.float64)
    if ref.shape != act.shape:
        raise AssertionError(f"shape mismatch: reference {tuple(ref.shape)}, "
                             f"actual {tuple(act.shape)}")
    diff = torch.linalg.vector_norm(act - ref).item()
    scale = torch.linalg.vector_norm(ref).item()
    return diff / scale if scale > 0 else diff


def assert_close(name: str, reference: torch.Tensor, actual: torch.Tensor, ratio: float) -> None:
    """Fail unless the relative error of ``actual`` against ``reference`` is <= ``ratio``."""
    if not torch.isfinite(actual.detach()).all():
        raise AssertionError(f"{name}: actual has non-finite values")
    err = relative_error(reference, actual)
    if not err <= ratio:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {ratio:.1e}")
