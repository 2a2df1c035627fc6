"""Splitting algorithms and error-free transformations behind the emulated types.

Design note `design/emulated_types.md`, sections 2.1-2.2, 4.2, 4.3 and 6.3:

* float splits of Ape (Ma et al., ICS '22): FP32-F (fp16 hi + fp16 lo scaled by 2^12),
  FP32-B (three bf16 pieces), FP32-T (two tf32 pieces), and INT16 as two int8 bytes;
* power-of-two row/column scaling, shared by the float splits and the Ozaki schemes;
* Ozaki scheme I slicing (Ozaki et al. 2012; as in ozIMMU, Ootomo, Ozaki, Yokota 2024):
  fixed-point int8 slices of beta bits, and the error-free (compensated) float64 sum of
  its exact level products (Ogita, Rump, Oishi 2005, Sum2);
* Ozaki scheme II (Ozaki, Uchino, Imamura 2024/2025, GEMMul8): scaling to integers,
  symmetric int8 residues modulo pairwise coprime moduli <= 256, and Chinese remaindering
  by Garner's mixed-radix algorithm with balanced digits followed by float64 Horner;
* double-word ("double-float") arithmetic on float32 pairs: Knuth's TwoSum, Dekker's
  Fast2Sum and TwoProduct (Dekker 1971), and the DWPlusDW / DWTimesDW algorithms with the
  error bounds of Joldes, Muller, Popescu, ACM TOMS 44(2), 2017.

Only the steps a device would run are written in float32 / small-int arithmetic; float64
appears where the note's CPU prototype uses it (Ozaki scaling and the final accumulation).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from furnace.emulation import formats

__all__ = [
    "INT16C_MAX",
    "INT16C_MIN",
    "FloatSplit",
    "OzakiSlices",
    "crt_moduli",
    "crt_reconstruct",
    "df_add",
    "df_dot",
    "df_mul",
    "fast_two_sum",
    "garner_digits",
    "mixed_radix_to_int",
    "ozaki1_beta",
    "compensated_sum",
    "ozaki2_scaling",
    "ozaki_reconstruct",
    "pow2_shifts",
    "ozaki_slices",
    "scale_to_integers",
    "split_float",
    "split_int16_to_int8",
    "to_residues",
    "two_prod",
    "two_sum",
]

# x = 256 h + l with both bytes in [-128, 127] reaches at most 127 * 256 + 127
INT16C_MAX = 127 * 256 + 127
INT16C_MIN = -128 * 256 - 128

# Veltkamp/Dekker splitting constant for float32 (p = 24): 2^ceil(p/2) + 1
_DEKKER_SPLITTER_F32 = np.float32(2**12 + 1)


# --------------------------------------------------------------------------------------
# power-of-two scaling
# --------------------------------------------------------------------------------------


def pow2_shifts(X, axis: int, top: int) -> np.ndarray:
    """Per-row (axis=1) or per-column (axis=0) shifts t with max |x| 2^t in [2^(top-1), 2^top).

    Multiplying by 2^t is exact as long as nothing leaves the float format's range, so a
    GEMM of scaled operands, scaled back, keeps every error bound of the unscaled one. All-
    zero rows/columns get t = 0.
    """
    arr = np.asarray(X)
    axis = _check_axis(axis)
    with np.errstate(invalid="ignore"):
        peak = np.max(np.abs(arr.astype(np.float64)), axis=axis, initial=0.0)
    _, e = np.frexp(peak)  # peak < 2^e
    return np.where(peak > 0, top - e.astype(np.int64), 0).astype(np.int64)


# --------------------------------------------------------------------------------------
# Ape float splits
# --------------------------------------------------------------------------------------


class FloatSplit(NamedTuple):
    """pieces[i] are float32 arrays holding values of the narrow format; with s the scale
    exponent, x == sum_i pieces[i] * 2^(-i*s) + residual exactly (residual is float64)."""

    pieces: list[np.ndarray]
    residual: np.ndarray


def _as_float32_exact(x, name: str) -> np.ndarray:
    """x as float32, refusing inputs that float32 would round (that would hide an error)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be real numeric, got dtype {arr.dtype}")
    out = arr.astype(np.float32)
    same = (out.astype(np.float64) == arr.astype(np.float64)) | (np.isnan(out) & np.isnan(arr))
    if not np.all(same):
        raise ValueError(f"{name} is not exactly representable in float32; round it first")
    return out


def split_float(x, fmt, pieces: int, scale_exponent: int = 0) -> FloatSplit:
    """Split float32 x into `pieces` values of the narrow `fmt` by successive rounding.

    r_0 = x;  p_i = RN_fmt(r_i);  r_{i+1} = (r_i - p_i) * 2^scale_exponent  (all float32),
    so x = sum_i p_i 2^(-i*scale_exponent) + r_n 2^(-n*scale_exponent).

    Ape's recipes: FP32-F is (FP16, 2, 12), FP32-B is (BF16, 3, 0), FP32-T is (TF32, 2, 0).

    Exactness: r_i - RN_fmt(r_i) is a multiple of ulp_fp32(r_i) no larger than |r_i|, hence
    exactly a float32 whenever the narrow format has <= 24 significant bits, and scaling by
    a power of two is exact short of overflow. So the float32 recurrence is error-free
    unless a piece overflows the narrow format (fp16 beyond 65504 gives inf and NaN
    residuals; this function raises then). For FP32-F that happens below Ape's FP32F_MAX:
    on [2^15, 2^16) fp16's ulp is 32, a residual of up to 16 times 2^12 reaches 65536, so the
    safe range is |x| < 2^15 (larger values overflow only near rounding ties). The bound
    |r_n| <= u^n |x| (unscaled, u the narrow unit roundoff) additionally needs every p_i
    to be a normal number of `fmt`:
    subnormal pieces (fp16 without scaling below ~6e-5, bf16's third piece below ~1e-33)
    keep exactness but lose the bound. The returned residual is the unscaled r_n in
    float64, where the scaling back by 2^(-n*s) cannot underflow.
    """
    fmt = formats.get_format(fmt)
    if isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 1:
        raise ValueError(f"pieces must be a positive int, got {pieces!r}")
    if isinstance(scale_exponent, bool) or not isinstance(scale_exponent, int):
        raise TypeError(f"scale_exponent must be an int, got {scale_exponent!r}")
    if fmt.precision > 24:
        raise ValueError(f"{fmt.name} is wider than float32; the split would not be exact")
    r = _as_float32_exact(x, "x")
    if not np.all(np.isfinite(r)):
        raise ValueError("x holds non-finite values; they cannot be split")
    scale = np.float32(2.0**scale_exponent)
    out = []
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(pieces):
            p = formats.round_to(r, fmt)
            if not np.all(np.isfinite(p)):
                worst = float(np.max(np.abs(r[~np.isfinite(p)])))
                raise OverflowError(
                    f"piece {i} overflows {fmt.name} (|value| up to {worst:.6g} > "
                    f"{fmt.max_finite:.6g}); choose a wider-range format"
                )
            out.append(p)
            r = (r - p) * scale
    if not np.all(np.isfinite(r)):
        raise OverflowError("the scaled residual overflowed float32; lower scale_exponent")
    residual = np.ldexp(r.astype(np.float64), -pieces * scale_exponent)
    return FloatSplit(out, residual)


def split_int16_to_int8(x) -> tuple[np.ndarray, np.ndarray]:
    """Split integers x = 256 h + l into signed bytes h, l in [-128, 127] (Ape INT16).

    l is the low byte read as signed, so h = (x - l) / 256 is exact. Two signed bytes reach
    only [-32896, 32639]: 32767 would need l = -1 and h = 128, outside int8. Hence Ape's
    INT16C_MAX = 32639; every negative int16 does fit.
    """
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.trunc(arr)):
            arr = arr.astype(np.int64)
        else:
            raise TypeError(f"x must hold integers, got dtype {arr.dtype}")
    x64 = arr.astype(np.int64)
    bad = (x64 > INT16C_MAX) | (x64 < INT16C_MIN)
    if np.any(bad):
        raise ValueError(
            f"{int(np.count_nonzero(bad))} value(s) outside [{INT16C_MIN}, {INT16C_MAX}] "
            f"(e.g. {int(x64[bad].flat[0])}); two int8 bytes cannot represent them"
        )
    low = ((x64 + 128) & 0xFF) - 128
    high = (x64 - low) >> 8
    return high.astype(np.int8), low.astype(np.int8)


# --------------------------------------------------------------------------------------
# Ozaki scheme I
# --------------------------------------------------------------------------------------


class OzakiSlices(NamedTuple):
    """A ~= sum_i slices[i] * 2^(exponents - beta*(i+1)), exponents broadcast along `axis`.

    `exponents` has one entry per row (axis=1, the A operand) or per column (axis=0, the
    B operand) and satisfies max |row| < 2^exponent.
    """

    slices: list[np.ndarray]
    exponents: np.ndarray
    beta: int
    axis: int


def ozaki1_beta(k: int) -> int:
    """Bits per int8 slice so that k products of two slices sum exactly in int32.

    beta = min(7, floor((31 - ceil(log2 k)) / 2)) as in ozIMMU: slice magnitudes are at most
    2^beta - 1, so the sum is below k * 4^beta <= 2^31.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    beta = min(7, (31 - math.ceil(math.log2(int(k)))) // 2)
    if beta < 1:
        raise ValueError(f"k = {k} is too long for exact int32 accumulation of int8 products")
    return beta


def _check_finite_matrix(A, name: str) -> np.ndarray:
    arr = np.asarray(A)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be real numeric, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.dtype.itemsize > 8:
        raise TypeError(f"{name} is {arr.dtype}; round it to float64 first")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds non-finite values")
    return arr


def _check_axis(axis: int) -> int:
    if axis not in (0, 1):
        raise ValueError(f"axis must be 1 (per-row scaling, A) or 0 (per-column, B), got {axis}")
    return axis


def ozaki_slices(A, num_slices: int, beta: int, axis: int) -> OzakiSlices:
    """Ozaki scheme I: cut A into int8 slices of `beta` bits after power-of-two scaling.

    With e = the exponent of the largest |entry| along `axis` (max < 2^e), Y = A 2^-e has
    |Y| < 1; each step Y <- Y 2^beta, T = trunc(Y), Y <- Y - T is exact in float64, and
    |T| <= 2^beta - 1. The slices reconstruct A truncated toward zero to s*beta bits
    below 2^e, so |A - sum| < 2^(e - s*beta) per entry: entries far below their row max keep
    fewer bits (the exponent-spread loss of section 4.2).
    """
    arr = _check_finite_matrix(A, "A")
    axis = _check_axis(axis)
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices must be a positive int, got {num_slices!r}")
    if isinstance(beta, bool) or not isinstance(beta, int) or not 1 <= beta <= 7:
        raise ValueError(f"beta must be an int in [1, 7] for int8 slices, got {beta!r}")
    _, exps = np.frexp(np.max(np.abs(arr), axis=axis, initial=0.0))
    exps = exps.astype(np.int64)
    shape = (-1, 1) if axis == 1 else (1, -1)
    Y = np.ldexp(arr, -exps.reshape(shape))
    step = 2.0**beta
    slices = []
    for _ in range(num_slices):
        Y = Y * step
        T = np.trunc(Y)
        Y = Y - T
        slices.append(T.astype(np.int8))
    return OzakiSlices(slices, exps, beta, axis)


def ozaki_reconstruct(sl: OzakiSlices) -> np.ndarray:
    """sum_i slices[i] 2^(e - beta(i+1)) in float64 by `compensated_sum`.

    Exact while s*beta <= 53 (the value is on the 53-bit grid below 2^e); beyond, the
    float64 nearest to the exact sum up to Sum2's second-order term.
    """
    shape = (-1, 1) if sl.axis == 1 else (1, -1)
    e = sl.exponents.reshape(shape)
    terms = [np.ldexp(sl.slices[i].astype(np.float64), e - sl.beta * (i + 1))
             for i in range(len(sl.slices))]
    hi, lo = compensated_sum(terms)
    return hi + lo


def _two_sum64(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def compensated_sum(terms) -> tuple[np.ndarray, np.ndarray]:
    """Sum of float64 arrays as hi + lo: Ogita, Rump, Oishi's Sum2 (SIAM J. Sci. Comput.
    26(6), 2005, Algorithm 4.4), elementwise.

    hi is the float64 running sum, each addition's rounding error is recovered exactly by
    TwoSum and collected in lo. fl(hi + lo) errs from the exact sum S by at most
    u|S| + gamma_(n-1)^2 sum|terms| (u = 2^-53): as if the sum were computed in twice the
    precision and rounded once. Ozaki scheme I adds its exact integer levels so, most
    significant first, instead of losing u of the running sum at each of them. No overflow
    is assumed (the levels are scaled to about 1).
    """
    terms = [np.asarray(t, dtype=np.float64) for t in terms]
    if not terms:
        raise ValueError("compensated_sum needs at least one term")
    hi = terms[0]
    lo = np.zeros_like(hi)
    for t in terms[1:]:
        hi, err = _two_sum64(hi, t)
        lo = lo + err
    return hi, lo


# --------------------------------------------------------------------------------------
# Ozaki scheme II (CRT)
# --------------------------------------------------------------------------------------


def crt_moduli(N: int) -> list[int]:
    """The N largest pairwise coprime moduli <= 256, chosen greedily downward from 256.

    Greedy choice reproduces GEMMul8's table: 256, 255, 253, 251, 247, 241, 239, ...
    """
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ValueError(f"N must be a positive int, got {N!r}")
    chosen: list[int] = []
    for p in range(256, 1, -1):
        if all(math.gcd(p, q) == 1 for q in chosen):
            chosen.append(p)
            if len(chosen) == N:
                return chosen
    raise ValueError(f"only {len(chosen)} pairwise coprime moduli <= 256 exist, asked for {N}")


def _check_modulus(p) -> int:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 2 <= p <= 256:
        raise ValueError(f"modulus must be an int in [2, 256], got {p!r}")
    return int(p)


def _pow2_mod(exps: np.ndarray, p: int) -> np.ndarray:
    """2^exps mod p elementwise for non-negative int64 exps, by square-and-multiply."""
    result = np.ones(exps.shape, dtype=np.int64)
    base = 2 % p
    e = exps.copy()
    while np.any(e > 0):
        result = np.where(e & 1, (result * base) % p, result)
        base = (base * base) % p
        e >>= 1
    return result


def _balanced(r: np.ndarray, p: int) -> np.ndarray:
    """Map r in [0, p) to the symmetric range: [-(p-1)/2, (p-1)/2] or [-p/2, p/2 - 1]."""
    return np.where(r >= (p + 1) // 2, r - p, r)


def to_residues(Ai, p: int) -> np.ndarray:
    """Symmetric residues of integer-valued float64 Ai modulo p, as int8.

    Exact at any magnitude: Ai = m 2^t with an integer |m| < 2^53 (from frexp), so
    Ai mod p = (m mod p)(2^t mod p) mod p for t >= 0, and for t < 0 integrality makes m
    divisible by 2^-t. This avoids np.fmod on huge floats (slow, section 5).
    """
    p = _check_modulus(p)
    arr = np.asarray(Ai)
    if arr.dtype.kind in "iu":
        if arr.size and np.max(np.abs(arr.astype(np.float64))) >= 2.0**62:
            raise ValueError("integer input must stay below 2^62 in magnitude")
        return _balanced(np.mod(arr.astype(np.int64), p), p).astype(np.int8)
    if arr.dtype.kind != "f" or arr.dtype.itemsize > 8:
        raise TypeError(f"Ai must be integer-valued float64 (or ints), got dtype {arr.dtype}")
    x = arr.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("Ai holds non-finite values")
    if np.any(x != np.trunc(x)):
        raise ValueError("Ai must be integer-valued; scale and truncate it first")
    frac, exp = np.frexp(x)
    mant = np.ldexp(frac, 53).astype(np.int64)
    shift = exp.astype(np.int64) - 53
    down = np.minimum(np.maximum(-shift, 0), 62)
    # integer-valued: for negative shifts the low bits of m are zero, so the shift is exact
    m = mant >> down
    r = np.mod(m, p) * _pow2_mod(np.maximum(shift, 0), p) % p
    return _balanced(r, p).astype(np.int8)


def _check_moduli(moduli) -> list[int]:
    mods = [_check_modulus(p) for p in moduli]
    if not mods:
        raise ValueError("need at least one modulus")
    for i in range(len(mods)):
        for j in range(i):
            if math.gcd(mods[i], mods[j]) != 1:
                raise ValueError(f"moduli {mods[j]} and {mods[i]} are not coprime")
    return mods


def garner_digits(residues, moduli) -> np.ndarray:
    """Balanced mixed-radix digits v of the CRT solution C, stacked on a new first axis.

    C = v_0 + p_0 (v_1 + p_1 (v_2 + ...)) with |v_i| <= p_i / 2; C is the unique solution
    of C = residues[i] (mod p_i) in the symmetric range of P = prod p_i. Garner's loop:
    x <- c_i; x <- (x - v_j) p_j^-1 mod p_i for j < i; v_i = balanced(x). All int64,
    values below 2^16. residues[i] may be any integers congruent to C mod p_i (e.g.
    unreduced int32 GEMM outputs).
    """
    mods = _check_moduli(moduli)
    if len(residues) != len(mods):
        raise ValueError(f"{len(residues)} residue arrays for {len(mods)} moduli")
    res = []
    for i, c in enumerate(residues):
        c = np.asarray(c)
        if c.dtype.kind not in "iu":
            raise TypeError(f"residues[{i}] must be integers, got dtype {c.dtype}")
        res.append(c.astype(np.int64))
    shape = res[0].shape
    if any(c.shape != shape for c in res):
        raise ValueError("residue arrays must all have the same shape")
    digits: list[np.ndarray] = []
    for i, p in enumerate(mods):
        x = np.mod(res[i], p)
        for j in range(i):
            inv = pow(mods[j], -1, p)
            x = np.mod((x - digits[j]) * inv, p)
        digits.append(_balanced(x, p))
    return np.stack(digits)


def mixed_radix_to_int(digits: np.ndarray, moduli) -> np.ndarray:
    """Exact Python-int value of balanced mixed-radix digits (object array), for checking."""
    mods = _check_moduli(moduli)
    total = np.zeros(digits.shape[1:], dtype=object)
    for i in reversed(range(len(mods))):
        total = digits[i].astype(object) + mods[i] * total
    return total


def crt_reconstruct(residues, moduli) -> np.ndarray:
    """CRT solution in the symmetric range of P = prod p_i, as float64.

    Garner digits, then Horner from the most significant digit in float64. With balanced
    digits a small |C| has zero leading digits, so the result is exact whenever
    |C| < 2^53 and otherwise within a few ulps (no double-double needed, section 6.3).
    """
    mods = _check_moduli(moduli)
    digits = garner_digits(residues, mods)
    total = np.zeros(digits.shape[1:], dtype=np.float64)
    for i in reversed(range(len(mods))):
        total = digits[i].astype(np.float64) + float(mods[i]) * total
    return total


def _log2_norms(X: np.ndarray, axis: int) -> np.ndarray:
    """log2 of the 2-norms along `axis`, scaled by the max first so nothing overflows."""
    _, e = np.frexp(np.max(np.abs(X), axis=axis, initial=0.0))
    shape = (-1, 1) if axis == 1 else (1, -1)
    Y = np.ldexp(X, -e.reshape(shape))
    with np.errstate(divide="ignore"):
        return np.log2(np.sqrt(np.sum(Y * Y, axis=axis))) + e


def ozaki2_scaling(A, B, N: int) -> tuple[np.ndarray, np.ndarray]:
    """Row shifts sa of A and column shifts sb of B for Ozaki scheme II with N moduli.

    GEMMul8's fast mode: s = floor((log2 P - 1.5)/2 - log2 ||v||_2) per row a_i / column
    b_j. Then A' = trunc(2^sa A) and B' = trunc(B 2^sb) satisfy, by Cauchy-Schwarz,
    |A'B'|_ij <= ||a_i'|| ||b_j'|| <= 2^(log2 P - 1.5) < P/2, so the product is recovered
    exactly by the CRT. Zero rows/columns get shift 0. Exactness of each int8 GEMM also
    needs k * 128^2 < 2^31, i.e. k <= 131071: that is the caller's blocking.
    """
    Af = _check_finite_matrix(A, "A")
    Bf = _check_finite_matrix(B, "B")
    if Af.shape[1] != Bf.shape[0]:
        raise ValueError(f"inner dimensions differ: A is {Af.shape}, B is {Bf.shape}")
    mods = crt_moduli(N)
    log2P = sum(math.log2(p) for p in mods)
    half = (log2P - 1.5) / 2
    la = _log2_norms(Af, axis=1)
    lb = _log2_norms(Bf, axis=0)
    sa = np.where(np.isfinite(la), np.floor(half - la), 0).astype(np.int64)
    sb = np.where(np.isfinite(lb), np.floor(half - lb), 0).astype(np.int64)
    return sa, sb


def scale_to_integers(A, shifts: np.ndarray, axis: int) -> np.ndarray:
    """trunc(2^shifts A) with shifts per row (axis=1) or per column (axis=0), in float64.

    Exact: a power-of-two scaling then a truncation; the results are integer-valued floats,
    possibly beyond 2^53, ready for `to_residues`.
    """
    arr = _check_finite_matrix(A, "A")
    axis = _check_axis(axis)
    shifts = np.asarray(shifts, dtype=np.int64)
    expected = arr.shape[0] if axis == 1 else arr.shape[1]
    if shifts.shape != (expected,):
        raise ValueError(f"need {expected} shifts for axis {axis}, got shape {shifts.shape}")
    shape = (-1, 1) if axis == 1 else (1, -1)
    return np.trunc(np.ldexp(arr, shifts.reshape(shape)))


# --------------------------------------------------------------------------------------
# double-float (double-word) arithmetic on float32 pairs
# --------------------------------------------------------------------------------------

_U32 = 2.0**-24


def two_sum(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Knuth's TwoSum in float32: s = RN(a + b) and e with a + b = s + e exactly.

    6 flops, no condition on the operands; error-free unless a + b overflows.
    """
    a = _as_float32_exact(a, "a")
    b = _as_float32_exact(b, "b")
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fast_two_sum(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's Fast2Sum in float32: s = RN(a + b), e = b - (s - a), so a + b = s + e.

    3 flops; exact only when |a| >= |b| (more precisely exponent(a) >= exponent(b)) or a = 0.
    The caller guarantees the ordering; it is not checked, as on a device.
    """
    a = _as_float32_exact(a, "a")
    b = _as_float32_exact(b, "b")
    s = a + b
    e = b - (s - a)
    return s, e


def _veltkamp_split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # c = (2^12 + 1) a; hi keeps the top 12 bits, lo the rest, both exact in float32
    c = _DEKKER_SPLITTER_F32 * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a, b) -> tuple[np.ndarray, np.ndarray]:
    """TwoProduct in float32: p = RN(a b) and e with a b = p + e exactly.

    A device would use e = fma(a, b, -p); numpy has no float32 fma, so this emulates it with
    Dekker's algorithm (1971): Veltkamp's split with 2^12 + 1 (p = 24 bits cut into two
    12-bit halves whose pairwise products are exact), then
    e = ((ah bh - p) + ah bl + al bh) + al bl, 17 flops in all. Exact provided nothing
    overflows (|a|, |b| below about 2^115 for the split) and a b stays above about
    2^-103 (so e does not underflow).
    """
    a = _as_float32_exact(a, "a")
    b = _as_float32_exact(b, "b")
    p = a * b
    ah, al = _veltkamp_split(a)
    bh, bl = _veltkamp_split(b)
    e = (((ah * bh - p) + ah * bl) + al * bh) + al * bl
    return p, e


def df_add(xh, xl, yh, yl) -> tuple[np.ndarray, np.ndarray]:
    """Sum of double-floats (xh, xl) + (yh, yl): JMP 2017 Algorithm 6 (AccurateDWPlusDW).

    Relative error <= 3u^2 + 13u^3 with u = 2^-24 (about 2^-46.4), for normalised inputs
    (|xl| <= ulp(xh)/2) and no overflow. 20 float32 flops.
    """
    sh, sl = two_sum(xh, yh)
    th, tl = two_sum(xl, yl)
    c = sl + th
    vh, vl = fast_two_sum(sh, c)
    w = tl + vl
    return fast_two_sum(vh, w)


def df_mul(xh, xl, yh, yl) -> tuple[np.ndarray, np.ndarray]:
    """Product of double-floats: JMP 2017 Algorithm 10 (DWTimesDW1).

    (ch, cl1) = TwoProd(xh, yh); cl2 = RN(xh yl) + RN(xl yh); then Fast2Sum(ch, cl1 + cl2).
    Relative error <= 7u^2 (u = 2^-24), normalised inputs, no under/overflow. The FMA
    variants (Algs. 11-12) reach 6u^2 and 5u^2 but need a fused multiply-add.
    """
    xh = _as_float32_exact(xh, "xh")
    xl = _as_float32_exact(xl, "xl")
    yh = _as_float32_exact(yh, "yh")
    yl = _as_float32_exact(yl, "yl")
    ch, cl1 = two_prod(xh, yh)
    tl = xh * yl
    th = xl * yh
    cl2 = th + tl
    cl3 = cl1 + cl2
    return fast_two_sum(ch, cl3)


def df_dot(x, y, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Dot product of float32 vectors along `axis` in double-float arithmetic.

    Each product is exact as a double-float (TwoProd); the running sum uses df_add.
    Error: |result - x.y| <= (k - 1) eps (1 + eps)^k sum |x_i y_i| with eps = 3u^2 + 13u^3,
    about k 2^-46.4 sum |x_i y_i|: the accumulation, not the products, limits accuracy.
    Products must not underflow (|x_i y_i| above about 2^-103) for TwoProd to be exact.
    """
    x = _as_float32_exact(x, "x")
    y = _as_float32_exact(y, "y")
    try:
        x, y = np.broadcast_arrays(x, y)
    except ValueError as exc:
        raise ValueError(f"x {x.shape} and y {y.shape} do not broadcast") from exc
    if x.ndim == 0:
        raise ValueError("df_dot needs at least one axis to reduce over")
    x = np.moveaxis(x, axis, -1)
    y = np.moveaxis(y, axis, -1)
    k = x.shape[-1]
    sh = np.zeros(x.shape[:-1], dtype=np.float32)
    sl = np.zeros(x.shape[:-1], dtype=np.float32)
    for i in range(k):
        ph, pl = two_prod(x[..., i], y[..., i])
        sh, sl = df_add(sh, sl, ph, pl)
    return sh, sl
