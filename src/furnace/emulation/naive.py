"""Exact and high-precision GEMM references and the error metrics for emulated types.

Follows the design note `design/emulated_types.md`, sections 4.4 (exact references) and 6.4
(exact reference and error metrics), used to grade Ape-style emulation (Ma et al., ICS '22)
and the Ozaki schemes (Ozaki et al. 2012; Ozaki, Uchino, Imamura 2024/2025).

* For fp32-class targets a float64 GEMM is an adequate reference: products of float32
  values are exact in float64 and the accumulation error is about k * 2^-53.
* For fp64-class targets the reference is exact: every float64 is m * 2^e with an integer
  m of at most 53 bits, so a dot product is an integer sum times a power of two, computed
  here with Python ints on a sample of entries. `np.longdouble` (80-bit x87 on x86-64, not
  binary128) serves only as a full-matrix cross-check.
* `exact_int_gemm` multiplies integer matrices with Python ints, the ground truth for the
  CRT (Ozaki scheme II) and INT8/INT16 checks.
* Metrics: normwise (with a floor tied to the inputs, `gemm_floor`, so a vanishing
  reference cannot divide by zero), componentwise against |A||B|, and the maximum
  elementwise relative error against each exact entry itself (floored at u64 (|A||B|)_ij),
  which a normwise figure lets small entries hide in.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = [
    "bits_correct",
    "componentwise_error",
    "elementwise_relative_error",
    "exact_gemm_entries",
    "exact_int_gemm",
    "exact_pairs",
    "gemm_floor",
    "gemm_reference",
    "longdouble_gemm",
    "normwise_error",
    "sample_entries",
    "sampled_componentwise_error",
]


def _check_gemm_operands(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(A)
    B = np.asarray(B)
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"GEMM operands must be 2-D, got shapes {A.shape} and {B.shape}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"inner dimensions differ: A is {A.shape}, B is {B.shape}")
    return A, B


def _check_finite_float(X: np.ndarray, name: str) -> np.ndarray:
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise TypeError(f"{name} must hold real floats or integers, got dtype {X.dtype}")
    if np.issubdtype(X.dtype, np.floating) and not np.all(np.isfinite(X)):
        raise ValueError(f"{name} holds non-finite values; an exact reference needs finite input")
    return X


def _mantissa_exponent(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split float values exactly into int64 mantissas m and exponents e with x = m * 2^e.

    float64 (and anything narrower, after an exact widening) has at most 53 significant
    bits, so m = frexp-mantissa * 2^53 is an integer below 2^53 in magnitude.
    """
    x64 = x.astype(np.float64)
    frac, exp = np.frexp(x64)
    mant = np.ldexp(frac, 53).astype(np.int64)
    return mant, exp.astype(np.int64) - 53


def sample_entries(
    m: int, n: int, count: int, rng: np.random.Generator | int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Pick `count` distinct (row, col) positions of an m x n result, uniformly at random.

    When count >= m * n every entry is returned, so small problems are checked in full.
    """
    if m <= 0 or n <= 0:
        raise ValueError(f"result shape must be positive, got {m} x {n}")
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    rng = np.random.default_rng(rng)
    total = m * n
    flat = np.arange(total) if count >= total else rng.choice(total, size=count, replace=False)
    return flat // n, flat % n


def exact_gemm_entries(
    A: np.ndarray, B: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """Exact values of (A @ B)[rows[t], cols[t]] as an object array of `Fraction`.

    Inputs may be any real float dtype up to float64 (or integers below 2^53). Each term
    a_k b_k = (ma mb) 2^(ea+eb) is shifted onto the smallest exponent of its dot product so
    the whole sum is one Python-int addition: exact, and much faster than Fraction sums.
    `float(result)` is then the correctly rounded float64 of the exact value.
    """
    A, B = _check_gemm_operands(A, B)
    _check_finite_float(A, "A")
    _check_finite_float(B, "B")
    rows = np.asarray(rows, dtype=np.int64).ravel()
    cols = np.asarray(cols, dtype=np.int64).ravel()
    if rows.shape != cols.shape:
        raise ValueError(f"rows and cols must pair up, got {rows.size} rows and {cols.size} cols")
    if rows.size and (rows.min() < 0 or rows.max() >= A.shape[0]):
        raise IndexError(f"row index outside 0..{A.shape[0] - 1}")
    if cols.size and (cols.min() < 0 or cols.max() >= B.shape[1]):
        raise IndexError(f"column index outside 0..{B.shape[1] - 1}")
    if np.issubdtype(A.dtype, np.integer) and np.abs(A).max(initial=0) >= 2**53:
        raise ValueError("integer A entries must be below 2^53 to pass through float64 exactly")
    if np.issubdtype(B.dtype, np.integer) and np.abs(B).max(initial=0) >= 2**53:
        raise ValueError("integer B entries must be below 2^53 to pass through float64 exactly")

    mA, eA = _mantissa_exponent(A)
    mB, eB = _mantissa_exponent(B)
    out = np.empty(rows.size, dtype=object)
    for t, (i, j) in enumerate(zip(rows.tolist(), cols.tolist())):
        ma, ea = mA[i].tolist(), eA[i].tolist()
        mb, eb = mB[:, j].tolist(), eB[:, j].tolist()
        terms = [(x * y, p + q) for x, p, y, q in zip(ma, ea, mb, eb) if x and y]
        if not terms:
            out[t] = Fraction(0)
            continue
        e_min = min(e for _, e in terms)
        total = sum(m << (e - e_min) for m, e in terms)
        out[t] = Fraction(total) * Fraction(2) ** e_min
    return out


def gemm_reference(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """float64 GEMM: the reference for fp32-class targets (error about k * 2^-53 |A||B|)."""
    A, B = _check_gemm_operands(A, B)
    return A.astype(np.float64) @ B.astype(np.float64)


def longdouble_gemm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """GEMM in `np.longdouble`: a cross-check for fp64-class targets, not an exact reference.

    On x86-64 Linux this is the 80-bit x87 format with a 64-bit mantissa, so the result
    carries about k * 2^-64 |A||B| of accumulation error; elsewhere it may be plain float64.
    """
    A, B = _check_gemm_operands(A, B)
    return A.astype(np.longdouble) @ B.astype(np.longdouble)


def exact_int_gemm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Exact product of integer matrices as an object array of Python ints (no overflow)."""
    A, B = _check_gemm_operands(A, B)
    for X, name in ((A, "A"), (B, "B")):
        if X.dtype != object and not np.issubdtype(X.dtype, np.integer):
            raise TypeError(f"{name} must be an integer (or object of int) array, got {X.dtype}")
    Ao = np.vectorize(int, otypes=[object])(A) if A.size else A.astype(object)
    Bo = np.vectorize(int, otypes=[object])(B) if B.size else B.astype(object)
    return Ao @ Bo


def _as_float_array(C: np.ndarray, name: str) -> np.ndarray:
    C = np.asarray(C)
    if C.dtype == object:
        return C
    if not (np.issubdtype(C.dtype, np.floating) or np.issubdtype(C.dtype, np.integer)):
        raise TypeError(f"{name} must be real, got dtype {C.dtype}")
    return C


def gemm_floor(A: np.ndarray, B: np.ndarray) -> float:
    """||A||_F ||B||_F / k: a floor for a GEMM's normwise error, tied to the inputs' scale.

    Unstructured data gives ||AB||_F of about ||A||_F ||B||_F / sqrt(k) (more with a common
    sign), so this floor sits a factor sqrt(k) below and only matters when the reference
    nearly vanishes, where a relative error would divide by (almost) zero.
    """
    A, B = _check_gemm_operands(A, B)
    k = max(A.shape[1], 1)
    norm = [float(np.linalg.norm(np.asarray(X, dtype=np.longdouble).astype(np.float64)))
            for X in (A, B)]
    return norm[0] * norm[1] / k


def normwise_error(C: np.ndarray, C_ref: np.ndarray, scale: float | None = None) -> float:
    """||C - C_ref||_F / max(||C_ref||_F, scale), in longdouble so the metric adds no noise.

    ``scale`` is an absolute floor tied to the inputs (`gemm_floor` for a GEMM); without
    it a zero reference gives 0 when C is also zero and inf otherwise.
    """
    C = _as_float_array(C, "C").astype(np.longdouble)
    C_ref = _as_float_array(C_ref, "C_ref").astype(np.longdouble)
    if C.shape != C_ref.shape:
        raise ValueError(f"shapes differ: C is {C.shape}, C_ref is {C_ref.shape}")
    floor = scale
    if floor is not None and not floor > 0:
        raise ValueError(f"scale must be positive, got {floor}")
    # rescale by the largest magnitude so squares neither overflow nor underflow
    peak = max(np.max(np.abs(C_ref), initial=0), np.max(np.abs(C - C_ref), initial=0))
    if peak == 0:
        return 0.0
    num = np.sqrt(np.sum(((C - C_ref) / peak) ** 2))
    den = np.sqrt(np.sum((C_ref / peak) ** 2))
    if floor is not None:
        den = max(den, np.longdouble(floor) / peak)
    if den == 0:
        return math.inf
    return float(num / den)


def componentwise_error(
    C: np.ndarray, C_ref: np.ndarray, A: np.ndarray, B: np.ndarray
) -> float:
    """max_ij |C - C_ref|_ij / (|A| |B|)_ij, the measure the GEMM error bounds speak about.

    Entries with (|A||B|)_ij = 0 have an exact product of 0: they count 0 when C matches
    and make the error inf when it does not.
    """
    A, B = _check_gemm_operands(A, B)
    C = _as_float_array(C, "C").astype(np.longdouble)
    C_ref = _as_float_array(C_ref, "C_ref").astype(np.longdouble)
    if C.shape != C_ref.shape or C.shape != (A.shape[0], B.shape[1]):
        raise ValueError(
            f"shapes differ: C {C.shape}, C_ref {C_ref.shape}, A @ B {(A.shape[0], B.shape[1])}"
        )
    absprod = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
    diff = np.abs(C - C_ref)
    if np.any(diff[absprod == 0] != 0):
        return math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(absprod > 0, diff / absprod, 0)
    return float(np.max(ratio, initial=0))


def sampled_componentwise_error(
    C: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    exact: np.ndarray | None = None,
) -> float:
    """componentwise_error restricted to sampled entries, against the exact Fraction values.

    The difference C_ij - C*_ij is formed exactly; only the final ratio is rounded.
    `exact` may be passed in to reuse `exact_gemm_entries` results across methods.
    """
    A, B = _check_gemm_operands(A, B)
    rows = np.asarray(rows, dtype=np.int64).ravel()
    cols = np.asarray(cols, dtype=np.int64).ravel()
    if exact is None:
        exact = exact_gemm_entries(A, B, rows, cols)
    if len(exact) != rows.size:
        raise ValueError(f"exact has {len(exact)} values for {rows.size} sampled entries")
    absA = np.abs(A.astype(np.float64))
    absB = np.abs(B.astype(np.float64))
    worst = 0.0
    for t, (i, j) in enumerate(zip(rows.tolist(), cols.tolist())):
        diff = abs(Fraction(float(C[i, j])) - exact[t])
        denom = float(absA[i] @ absB[:, j])
        if denom == 0:
            if diff != 0:
                return math.inf
            continue
        worst = max(worst, float(diff) / denom)
    return worst


def exact_pairs(exact) -> tuple[np.ndarray, np.ndarray]:
    """`Fraction` values as float64 pairs hi + lo: hi = RN(x), lo = RN(x - hi).

    x - hi - lo is at most 2^-106 |x|, so the pair stands in for the exact value wherever
    errors above that are measured, and vectorised code can use it.
    """
    hi = np.array([float(x) for x in exact], dtype=np.float64)
    lo = np.array([float(x - Fraction(h)) for x, h in zip(exact, hi.tolist())],
                  dtype=np.float64)
    return hi, lo


def elementwise_relative_error(
    C: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    exact=None,
    floor: float = 2.0**-53,
) -> float:
    """max over the sampled entries of |C - C*|_ij / max(|C*_ij|, floor (|A||B|)_ij).

    The maximum elementwise relative error: each entry against itself, which a normwise
    or an |A||B|-relative measure lets small entries hide in. The floor, tied to the
    inputs' scale (the natural scale of a GEMM entry's error), keeps an exactly or nearly
    zero C*_ij from dividing by zero; at the default u64 it asks for float64 accuracy of
    every entry, or of its u64 (|A||B|)_ij when cancellation made it smaller than that.
    ``exact`` holds the `Fraction` values of `exact_gemm_entries` (computed here unless
    given) or their `exact_pairs`; the difference (C - hi) - lo is then accurate to about
    2^-52 of itself plus 2^-106 |C*|. An entry with (|A||B|)_ij = 0 counts 0 if C matches
    and inf otherwise.
    """
    A, B = _check_gemm_operands(A, B)
    rows = np.asarray(rows, dtype=np.int64).ravel()
    cols = np.asarray(cols, dtype=np.int64).ravel()
    if not floor > 0:
        raise ValueError(f"floor must be positive, got {floor}")
    if exact is None:
        exact = exact_gemm_entries(A, B, rows, cols)
    hi, lo = exact if isinstance(exact, tuple) else exact_pairs(exact)
    if hi.shape != rows.shape:
        raise ValueError(f"exact has {hi.size} values for {rows.size} sampled entries")
    absA = np.abs(A.astype(np.float64))
    absB = np.abs(B.astype(np.float64))
    scale = np.einsum("tk,kt->t", absA[rows], absB[:, cols])
    got = np.asarray(C, dtype=np.float64)[rows, cols]
    diff = np.abs((got - hi) - lo)
    denom = np.maximum(np.abs(hi), floor * scale)
    if np.any(diff[denom == 0] != 0):
        return math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(denom > 0, diff / denom, 0.0)
    return float(np.max(ratio, initial=0.0))


def bits_correct(error: float) -> float:
    """-log2(error): the number of correct bits a relative error corresponds to (inf at 0)."""
    if not error >= 0:
        raise ValueError(f"error must be a non-negative number, got {error}")
    if error == 0:
        return math.inf
    return -math.log2(error)
