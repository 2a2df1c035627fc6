"""Test helpers shared by every system's test suite.

`assert_close` compares a fast path against its reference with a relative error
(the norm of the difference over the norm of the reference, as flash-linear-attention's
``assert_close``), so one tolerance means the same thing for every tensor size. The
denominator has an absolute floor (``scale``) tied to the inputs, so a reference that is
exactly zero, such as a gradient a path never reads, cannot make the ratio blow up.
`run_distributed` (from `launch`) is the multi-rank harness.
"""

from __future__ import annotations

import random
from typing import Protocol

import numpy as np
import torch

from .launch import run_distributed

__all__ = ["assert_close", "max_relative_error", "relative_error", "run_distributed", "seed_all",
           "start_vector"]


class Shaped(Protocol):
    """A matrix or operator with a shape: an array, a scipy sparse matrix, a LinearOperator."""

    @property
    def shape(self) -> tuple[int, ...]: ...


def seed_all(seed: int = 42) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def start_vector(matrix: Shaped, seed: int = 0) -> np.ndarray:
    """A fixed random start for ARPACK (`scipy.sparse.linalg.eigsh`'s ``v0``).

    scipy >= 1.15 draws the default start from OS entropy, so a slow run cannot be replayed
    (a test that takes ~5 s once spent over 120 s inside ARPACK in CI).
    """
    return np.random.default_rng(seed).standard_normal(matrix.shape[0])


def relative_error(reference: torch.Tensor, actual: torch.Tensor,
                   scale: float | None = None) -> float:
    """||actual - reference|| / max(||reference||, scale) in float64.

    ``scale`` is an absolute floor tied to the inputs' magnitude (for a gradient, the norm
    of the output or of the inputs it flows from). It matters where the reference is
    exactly zero, as a gradient that a path never reads is: rounding in the fast path
    then gives ~1e-16 against 0, which a pure ratio turns into 1 or 1e14. Without a floor
    a zero reference is an error, since no tolerance means anything relative to 0.
    """
    ref = reference.detach().to(torch.float64)
    act = actual.detach().to(torch.float64)
    if ref.shape != act.shape:
        raise AssertionError(f"shape mismatch: reference {tuple(ref.shape)}, "
                             f"actual {tuple(act.shape)}")
    diff: float = torch.linalg.vector_norm(act - ref).item()
    denominator: float = max(torch.linalg.vector_norm(ref).item(), scale or 0.0)
    if not denominator > 0:
        raise AssertionError("the reference is zero and no scale was given: pass scale= "
                             "(the inputs' magnitude) so the tolerance has a meaning")
    return diff / denominator


def max_relative_error(reference: torch.Tensor, actual: torch.Tensor,
                       scale: float | None = None) -> float:
    """max |actual - reference| / max(max |reference|, scale): the elementwise-max form."""
    ref = reference.detach().to(torch.float64)
    act = actual.detach().to(torch.float64)
    if ref.shape != act.shape:
        raise AssertionError(f"shape mismatch: reference {tuple(ref.shape)}, "
                             f"actual {tuple(act.shape)}")
    diff = (act - ref).abs().max().item() if ref.numel() else 0.0
    peak = ref.abs().max().item() if ref.numel() else 0.0
    denominator = max(peak, scale or 0.0)
    if not denominator > 0:
        raise AssertionError("the reference is zero and no scale was given: pass scale= "
                             "(the inputs' magnitude) so the tolerance has a meaning")
    return diff / denominator


def assert_close(name: str, reference: torch.Tensor, actual: torch.Tensor, ratio: float,
                 scale: float | None = None) -> None:
    """Fail unless ``relative_error(reference, actual, scale) <= ratio``."""
    if not torch.isfinite(actual.detach()).all():
        raise AssertionError(f"{name}: actual has non-finite values")
    err = relative_error(reference, actual, scale)
    if not err <= ratio:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {ratio:.1e}")
