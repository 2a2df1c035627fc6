"""Test matrices for the emulated GEMMs (Ape, Ma et al., ICS '22, "error analysis"; design
note `emulated_types.md` 5 and 6.7): the four operand distributions that `furnace emulate
gemm --dist` and `furnace reproduce emulation` (the accuracy ladder) multiply.

Each distribution stresses a different part of an emulated type: ``uniform`` and ``normal``
its mantissa, ``wide`` its exponent range (some entries beyond fp16), ``cancel`` the
cancellation of a large common offset.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DISTRIBUTIONS", "make_operands"]

DISTRIBUTIONS = ("uniform", "normal", "wide", "cancel")


def make_operands(dist: str, size: int, dtype, rng: np.random.Generator):
    """Test matrices: uniform [-1, 1], standard normal, wide range (exponents 2^-20..2^20,
    some beyond fp16), or cancelling (a large common offset with small differences).

    An integer ``dtype`` gives integer analogues inside INT16's two-byte range: uniform
    over it, rounded normal with deviation 4096, magnitudes 2^0..2^15 with random signs,
    and 16384 plus small integers times small integers of both signs.
    """
    shape = (size, size)
    A: np.ndarray
    B: np.ndarray
    if np.dtype(dtype).kind in "iu":
        from .splits import INT16C_MAX, INT16C_MIN

        if dist == "uniform":
            A, B = (rng.integers(INT16C_MIN, INT16C_MAX + 1, shape) for _ in range(2))
        elif dist == "normal":
            A, B = (np.rint(rng.standard_normal(shape) * 4096) for _ in range(2))
        elif dist == "wide":
            A, B = (rng.choice([-1, 1], shape) * np.floor(2.0 ** rng.uniform(0, 15, shape))
                    for _ in range(2))
        elif dist == "cancel":
            A = 16384 + np.rint(rng.standard_normal(shape) * 64)
            B = np.rint(rng.standard_normal(shape) * 64) * rng.choice([-1, 1], shape)
        else:
            raise ValueError(f"unknown distribution {dist!r}; choose from {DISTRIBUTIONS}")
        return (np.clip(A, INT16C_MIN, INT16C_MAX).astype(dtype),
                np.clip(B, INT16C_MIN, INT16C_MAX).astype(dtype))
    if dist == "uniform":
        A, B = rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape)
    elif dist == "normal":
        A, B = rng.standard_normal(shape), rng.standard_normal(shape)
    elif dist == "wide":
        A = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 21, shape)
        B = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-20, 21, shape)
    elif dist == "cancel":
        A = 1e3 + rng.standard_normal(shape)
        B = rng.standard_normal(shape) * np.where(rng.random(shape) < 0.5, 1.0, -1.0)
    else:
        raise ValueError(f"unknown distribution {dist!r}; choose from {DISTRIBUTIONS}")
    return A.astype(dtype), B.astype(dtype)
