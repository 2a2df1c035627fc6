"""The emulated GEMM types: high-bitwidth GEMMs built only from a `DSA`'s native operations.

Design note `design/emulated_types.md` sections 2 (Ape), 4.1-4.3 and 6.2-6.3 (catalogue and
algorithms), 6.9 (pitfalls):

* Ape's FP32 emulations (Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, ICS '22): FP32-F (fp16
  high + fp16 low scaled by 2^12, 3 products), FP32-B (three bf16 pieces, 6 products),
  FP32-T (two tf32 pieces, 3 products, with the explicit tf32 rounding of CUTLASS 3xTF32
  instead of Ape's ineffective split, section 2.4), and INT16 from four int8 GEMMs;
* the neighbours of section 4.1: plain BF16 / TF32 / FP16 rounding, BF16x2 (3 products),
  FP32-B9 (all 9 bf16 products, cuBLAS BF16x9);
* FP64 from int8 units (section 4.2): Ozaki scheme I (Ozaki et al. 2012, ozIMMU) and
  Ozaki scheme II (Ozaki, Uchino, Imamura, CRT, GEMMul8);
* DF32: double-float dot products on the FP32 vector unit (section 4.3; Joldes, Muller,
  Popescu, ACM TOMS 2017).

Every matrix-unit product goes through ``dsa.mm`` / ``dsa.mm_int8``; the float merges run
on the DSA's FP32 vector unit (``dsa.add`` / ``dsa.mul``). The splitting, and the integer
and float64 merges of INT16 and the Ozaki schemes, run on the host with `splits`; they are
elementwise vector work on a device, so each is charged to ``dsa.counters`` under the
"vector:fp32" unit with the per-element op counts stated next to it (estimates, not traces).

Operands. Every float type scales the rows of A and the columns of B by powers of two
before splitting (exact, as the Ozaki schemes do), so a row of tiny or huge numbers is
handled like a row of ones; what limits a type is the spread of magnitudes within a row or
column and the float32 range of the result. NaN and +-inf propagate as IEEE 754 (and
torch) do: a row of A or column of B holding one gives the NaN / inf entries a native GEMM
would; the rest is computed from the finite data.

Error bounds (``error_bound(k)``) are a priori and hold on every input the type accepts:
``range_problem(A, B)`` says why a type refuses its operands (the preconditions of the
bound: pieces that meet the split's relative bounds, exact piece products, a result inside
the output format's range), ``fits_range`` is its yes/no, and ``gemm`` raises `RangeError`
with that reason instead of returning an answer the bound does not cover. ``bound_kind``
says which metric a type's bound is about:

* "componentwise": max_ij |C - AB|_ij / (|A||B|)_ij  (fp32 family, narrow, INT16, DF32);
* "operand-normwise": ||C - AB||_F / (||A||_F ||B||_F)  (Ozaki schemes, whose accuracy is
  relative to the row/column scale, not to each entry: section 4.2's exponent-spread loss).

`bound_metric` evaluates the matching observed quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from furnace.emulation import formats, splits
from furnace.emulation.dsa import DSA, INT32_MAX, NotNativeError
from furnace.runtime.presets import a100_dsa

__all__ = [
    "TYPES",
    "EmulatedType",
    "RangeError",
    "bound_metric",
    "OperandStats",
    "get_type",
    "ieee_nonfinite_products",
    "operand_stats",
    "ozaki1",
    "ozaki2",
]

U32 = 2.0**-24
U64 = 2.0**-53
# Ape FP32-F: fp16 pieces of |x| in [2^15, 2^16) have ulp 32, and a residual of up to 16
# scaled by 2^12 reaches 65536 > 65504 (splits.split_float); so the safe range is < 2^15,
# and the fp16 types scale every row / column maximum into [2^14, 2^15)
FP32F_MAX = 2.0**15
# bf16 / tf32 have float32's exponent range; their row maxima go to [2^31, 2^32), the middle
# of it, so tiny entries keep normal pieces and k 2^64 still fits float32
_WIDE_TOP = 32
# DF32 keeps fp32's exponent range: inside [2^-40, 2^40] the low halves and cross products
# stay clear of fp32 under/overflow well enough for the bound (see _DoubleFloatType)
DF32_MIN = 2.0**-40
DF32_MAX = 2.0**40
# float32 results: with k max|A| max|B| below 2^126 nothing overflows; with every nonzero
# |a_ik| |b_kj| at least 2^-110 an entry rounded in float32's subnormal range errs by at most
# 2^-150 <= 2^-40 (|A||B|)_ij, the allowance added to the fp32-output bounds
_F32_OUT_MAX = 2.0**126
_F32_OUT_MIN = 2.0**-110
_F32_UNDERFLOW = 2.0**-40
# float64 results of the Ozaki schemes: with max|A| max|B| >= 2^-900 an output rounded in
# float64's subnormal range (<= 2^-1075 per entry) costs < 2^-100 of ||A||_F ||B||_F
_F64_OUT_MAX = 2.0**1020
_F64_OUT_MIN = 2.0**-900
_F64_UNDERFLOW = 2.0**-100
# int8 GEMM blocks: k * 128 * 128 must stay <= 2^31 - 1 for the DSA's exact INT32 guard
_INT8_K_BLOCK = INT32_MAX // (128 * 128)
_STORAGE_BYTES = {"fp16": 2, "bf16": 2, "tf32": 4, "int8": 1}


class RangeError(ValueError):
    """Input values outside the range an emulated type handles correctly."""


def _gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the bound of n roundings' accumulated error."""
    if n <= 0:
        return 0.0
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def _charge(dsa: DSA, op: str, flops: int, nbytes: int) -> None:
    # host-side elementwise passes a device would run on its vector unit; see module doc
    dsa.counters.record(op, "vector:fp32", int(flops), int(nbytes))


def _check_shapes(A, B, name: str) -> tuple[np.ndarray, np.ndarray]:
    A = np.asarray(A)
    B = np.asarray(B)
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"{name}: GEMM operands must be 2-D, got {A.shape} and {B.shape}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{name}: inner dimensions differ, {A.shape} @ {B.shape}")
    return A, B


def _float_operands(A, B, name: str, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A, B as `dtype` without rounding (a silent rounding would hide an error); NaN and
    infinities are kept (they propagate, see `EmulatedType.gemm`)."""
    A, B = _check_shapes(A, B, name)
    out = []
    for label, X in (("A", A), ("B", B)):
        if X.dtype.kind not in "fiu" or (X.dtype.kind == "f" and X.dtype.itemsize > 8):
            raise TypeError(f"{name}: {label} must be real float32/float64 data, got {X.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            Y = X.astype(dtype)
            same = Y.astype(np.float64) == X.astype(np.float64)
        if not np.all(same | ~np.isfinite(X)):
            raise TypeError(
                f"{name}: {label} holds values that are not exact in {np.dtype(dtype).name}; "
                f"this type takes {np.dtype(dtype).name} inputs"
            )
        out.append(Y)
    return out[0], out[1]


def _mm_int8_blocked(dsa: DSA, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of int8 data as int64, k cut into blocks the INT32 accumulator holds exactly."""
    k = a.shape[1]
    if k <= _INT8_K_BLOCK:
        return dsa.mm_int8(a, b).astype(np.int64)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=np.int64)
    for start in range(0, k, _INT8_K_BLOCK):
        stop = min(start + _INT8_K_BLOCK, k)
        out += dsa.mm_int8(a[:, start:stop], b[start:stop]).astype(np.int64)
    return out


def ieee_nonfinite_products(A, B) -> np.ndarray:
    """IEEE 754 value of each entry of A @ B that a NaN or infinite operand reaches.

    Entry (i, j) is NaN if some term a_ik b_kj is NaN (a NaN factor, or inf times 0) or the
    infinite terms have both signs; +-inf if there are infinite terms, all of one sign; 0
    where every term is finite (those entries are not this function's business). This is
    what a native GEMM gives, torch's included, except when finite terms alone overflow
    next to infinite ones, where a native result depends on its summation order. Counts of
    0/1 indicator products are exact in float64, so the classification is exact.
    """
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)

    def reach(X, Y) -> np.ndarray:
        return (X.astype(np.float64) @ Y.astype(np.float64)) > 0

    nan_a, nan_b = np.isnan(A), np.isnan(B)
    pinf_a, ninf_a = A == np.inf, A == -np.inf
    pinf_b, ninf_b = B == np.inf, B == -np.inf
    fin_a = np.isfinite(A)
    pos_a, neg_a, zero_a = A > 0, A < 0, A == 0
    pos_b, neg_b, zero_b = B > 0, B < 0, B == 0
    nan = (nan_a.any(axis=1)[:, None] | nan_b.any(axis=0)[None, :]
           | reach(pinf_a | ninf_a, zero_b) | reach(zero_a, pinf_b | ninf_b))
    plus = (reach(pinf_a, pos_b) | reach(ninf_a, neg_b) | reach(pos_a & fin_a, pinf_b)
            | reach(neg_a & fin_a, ninf_b))
    minus = (reach(pinf_a, neg_b) | reach(ninf_a, pos_b) | reach(pos_a & fin_a, ninf_b)
             | reach(neg_a & fin_a, pinf_b))
    out = np.where(plus, np.inf, np.where(minus, -np.inf, 0.0))
    return np.where(nan | (plus & minus), np.nan, out)


def _as_operands(A, B=None) -> tuple[np.ndarray, np.ndarray]:
    """fits_range's (A, B): a lone array is a left operand, against a column of ones."""
    A = np.asarray(A)
    if A.ndim == 1:
        A = A.reshape(1, -1)
    if B is None:
        B = np.ones((A.shape[1], 1), dtype=A.dtype if A.dtype.kind == "f" else np.float64)
    return np.asarray(A), np.asarray(B)


class OperandStats(NamedTuple):
    """What the float types' range checks read: per row of A and per column of B the
    largest |entry| and the smallest nonzero one (inf for an all-zero row), and k."""

    row_max: np.ndarray
    row_min: np.ndarray
    col_max: np.ndarray
    col_min: np.ndarray
    k: int


def operand_stats(A: np.ndarray, B: np.ndarray) -> OperandStats:
    """`OperandStats` of finite operands (two passes over each; no copy of the data kept)."""

    def extremes(X: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        Xa = np.abs(X.astype(np.float64, copy=False))
        top = np.max(Xa, axis=axis, initial=0.0)
        low = np.min(Xa, axis=axis, initial=np.inf, where=Xa > 0)
        return top, low

    row_max, row_min = extremes(A, 1)
    col_max, col_min = extremes(B, 0)
    return OperandStats(row_max, row_min, col_max, col_min, A.shape[1])


def _zero_nonfinite(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A with its rows, B with its columns that hold NaN / inf set to 0 (see gemm)."""
    bad_rows = ~np.all(np.isfinite(A), axis=1)
    bad_cols = ~np.all(np.isfinite(B), axis=0)
    if bad_rows.any():
        A = A.copy()
        A[bad_rows] = 0
    if bad_cols.any():
        B = B.copy()
        B[:, bad_cols] = 0
    return A, B


@dataclass(frozen=True)
class EmulatedType:
    """One emulated GEMM type: its name, family, native unit and cost, and its algorithm.

    ``family``: "fp32" | "fp64" | "int16" | "narrow"; ``native``: "fp16" | "bf16" | "tf32" |
    "int8" | "vector"; ``native_gemms``: matrix-unit GEMMs per emulated GEMM.

    Subclasses give ``_operands`` (the exact dtype conversion), ``stats_problem`` (or
    ``_finite_range_problem``: the range check of finite operands) and ``_gemm`` (the
    algorithm on finite, in-range operands with k >= 1); `gemm` does the rest: the
    native-format check, NaN / inf propagation, the range check, k = 0.
    """

    name: str
    family: str
    native: str
    native_gemms: int
    description: str

    bound_kind: ClassVar[str] = "componentwise"
    # float types propagate NaN / inf as IEEE 754 does; INT16 takes integers only
    propagates_nonfinite: ClassVar[bool] = True
    # whether stats_problem decides the range from OperandStats (INT16 needs the data)
    range_from_stats: ClassVar[bool] = True

    @property
    def output_dtype(self):
        return {"fp64": np.float64, "int16": np.int64}.get(self.family, np.float32)

    def gemm(self, A, B, dsa: DSA) -> np.ndarray:
        """A @ B emulated on ``dsa``; float32 / float64 / int64 result by family.

        Raises `NotNativeError` if ``dsa`` lacks the type's matrix format, `RangeError` if
        the operands are outside what the error bound covers (``range_problem`` says why),
        TypeError for operands the type's input precision would round.
        """
        A, B = self._operands(A, B)
        self._require_native(dsa)
        m, n = A.shape[0], B.shape[1]
        bad_rows = ~np.all(np.isfinite(A), axis=1)
        bad_cols = ~np.all(np.isfinite(B), axis=0)
        special = self.propagates_nonfinite and bool(bad_rows.any() or bad_cols.any())
        # every entry of a row / column holding NaN or inf is NaN or inf; the rest comes
        # from the finite data alone, so those rows and columns leave the emulated product
        A_in, B_in = _zero_nonfinite(A, B) if special else (A, B)
        problem = self._finite_range_problem(A_in, B_in)
        if problem is not None:
            raise RangeError(f"{self.name}: inputs out of its range: {problem}")
        if A.shape[1] == 0:
            C = np.zeros((m, n), dtype=self.output_dtype)
        else:
            C = self._gemm(A_in, B_in, dsa)
        if special:
            C = np.array(C, dtype=self.output_dtype)
            C[bad_rows] = ieee_nonfinite_products(A[bad_rows], B)
            C[:, bad_cols] = ieee_nonfinite_products(A, B[:, bad_cols])
            reached = int(bad_rows.sum()) * n + int(bad_cols.sum()) * m
            _charge(dsa, "ieee_nonfinite", reached * A.shape[1], C.nbytes)
        return C

    def fits_range(self, A, B=None) -> bool:
        """Whether ``gemm(A, B)`` runs inside the type's bound (a lone A: against ones)."""
        return self.range_problem(A, B) is None

    def range_problem(self, A, B=None) -> str | None:
        """Why ``gemm(A, B)`` would refuse these operands, or None if it accepts them.

        NaN and infinities are no range problem (they propagate); operands the type's
        input precision would round are (the caller must round them first).
        """
        A, B = _as_operands(A, B)
        try:
            A, B = self._operands(A, B)
        except (TypeError, ValueError) as exc:
            return str(exc)
        if self.propagates_nonfinite:
            A, B = _zero_nonfinite(A, B)
        return self._finite_range_problem(A, B)

    def stats_problem(self, stats: OperandStats) -> str | None:
        """`range_problem` of finite operands from their `OperandStats` alone (the float
        types need nothing else; the selector computes the statistics once per GEMM)."""
        raise NotImplementedError

    def _finite_range_problem(self, A: np.ndarray, B: np.ndarray) -> str | None:
        return self.stats_problem(operand_stats(A, B))

    def error_bound(self, k: int) -> float:
        """A-priori bound for inner dimension k, in the metric named by ``bound_kind``."""
        raise NotImplementedError

    def _operands(self, A, B) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _gemm(self, A: np.ndarray, B: np.ndarray, dsa: DSA) -> np.ndarray:
        raise NotImplementedError

    def _require_native(self, dsa: DSA) -> None:
        if self.native == "vector":
            return
        if self.native not in dsa.matrix_formats:
            raise NotNativeError(
                f"{self.name} needs a {self.native} matrix unit; {dsa.profile.name} has "
                f"{sorted(dsa.matrix_formats)}"
            )



def _float32_output_problem(st: OperandStats) -> str | None:
    """Why a float32 result could leave the range the fp32-output bounds cover."""
    top = float(np.max(st.row_max, initial=0.0) * np.max(st.col_max, initial=0.0)) * st.k
    if top >= _F32_OUT_MAX:
        return (f"k max|A| max|B| = {top:.3g} >= 2^126: the product may overflow float32 "
                "(scale the operands)")
    low = float(np.min(st.row_min, initial=np.inf) * np.min(st.col_min, initial=np.inf))
    if low < _F32_OUT_MIN:
        return (f"the smallest nonzero |a| |b| = {low:.3g} < 2^-110: results that small "
                "round in float32's subnormal range, beyond the bound")
    return None


# --------------------------------------------------------------------------------------
# float splits on fp16 / bf16 / tf32 matrix units (Ape section 2.1, design note 6.3)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SplitFloatType(EmulatedType):
    """x = sum_i p_i 2^(-i s) (narrow pieces); C = sum over kept pairs of p_i q_j 2^(-(i+j)s).

    Rows of A and columns of B are first scaled by powers of two so that their largest
    |entry| lies in [2^(top-1), 2^top) (exact; undone on the result), the narrow
    format's comfortable range: top = 15 for fp16 (below Ape's overflow point, see
    FP32F_MAX), 32 for bf16 / tf32. Products of one level i + j are added first, levels from
    the smallest up (section 6.9: accumulate small terms first), each level scaled back by
    an exact power of two on the vector unit.
    """

    pieces: int = 1
    scale_exponent: int = 0
    pairs: tuple[tuple[int, int], ...] = ((0, 0),)
    top: int = _WIDE_TOP

    def _operands(self, A, B):
        return _float_operands(A, B, self.name, np.float32)

    @property
    def min_scaled(self) -> float:
        """L: every nonzero scaled entry |x'| >= L keeps the split's relative bounds.

        With R_0 = x', P_i = RN(R_i), R_(i+1) = (R_i - P_i) 2^s, a rounding errs by at most
        max(u |R_i|, q/2) (q the format's smallest subnormal), so by induction the unscaled
        residuals satisfy |r_(i+1)| <= u^(i+1) |x'| as long as q 2^(-i s) / 2 <= u^(i+1) |x'|
        for every i < pieces; then |p_i| <= (1+u) u^i |x'|, the premises of `error_bound`.
        L is the largest of those thresholds: 2^-14 for FP16 and FP32-F (Ape's FP32F_MIN
        was 2^-15, where the high part is already subnormal), 2^-110 for FP32-B.
        """
        fmt = formats.get_format(self.native)
        u, q, sig = fmt.unit_roundoff, fmt.min_subnormal, self.scale_exponent
        return max(q * 2.0 ** (-i * sig) / (2 * u ** (i + 1)) for i in range(self.pieces))

    def stats_problem(self, st: OperandStats) -> str | None:
        problem = _float32_output_problem(st)
        if problem is not None:
            return problem
        floor = self.min_scaled
        grains = []
        for side, top, low in (("A", st.row_max, st.row_min), ("B", st.col_max, st.col_min)):
            used = top > 0
            if not used.any():
                return None  # a zero operand: the product is exactly zero
            _, e = np.frexp(top[used])
            worst = float(np.min(np.ldexp(low[used], self.top - e)))
            if worst < floor:
                spread = float(np.max(top[used] / low[used]))
                return (f"{side}: magnitudes within a row/column spread too widely for "
                        f"{self.native}: max/min nonzero up to {spread:.3g}, so scaled entries "
                        f"reach {worst:.3g} < {floor:.3g}, below the split's normal range")
            # every piece of every scaled entry is a multiple of the float32 ulp of the
            # smallest one (the float32 split is exact)
            grains.append(math.ldexp(1.0, math.frexp(worst)[1] - 24))
        if grains[0] * grains[1] < 2.0**-149:
            return (f"products of pieces of the smallest entries would reach "
                    f"{grains[0] * grains[1]:.3g} < 2^-149, where float32 products are not exact "
                    "(magnitudes within rows of A and columns of B spread too widely)")
        return None

    def _gemm(self, A32, B32, dsa: DSA) -> np.ndarray:
        # scaled so that every row / column maximum lies in [2^(top-1), 2^top): exact, as
        # stats_problem made sure every nonzero scaled entry is normal in float32
        sa = splits.pow2_shifts(A32, axis=1, top=self.top)
        sb = splits.pow2_shifts(B32, axis=0, top=self.top)
        a = splits.split_float(np.ldexp(A32, sa.reshape(-1, 1).astype(np.int32)), self.native,
                               self.pieces, self.scale_exponent).pieces
        b = splits.split_float(np.ldexp(B32, sb.reshape(1, -1).astype(np.int32)), self.native,
                               self.pieces, self.scale_exponent).pieces
        # per element: a row/column maximum and a scaling, then per piece one rounding
        # conversion, one subtraction, one scaling
        elems = A32.size + B32.size
        _charge(
            dsa, f"split_{self.native}", (2 + 3 * self.pieces) * elems,
            (4 + self.pieces * _STORAGE_BYTES[self.native]) * elems,
        )
        total = None
        for level in sorted({i + j for i, j in self.pairs}, reverse=True):
            acc = None
            for i, j in sorted(p for p in self.pairs if sum(p) == level):
                prod = dsa.mm(a[i], b[j], self.native)
                acc = prod if acc is None else dsa.add(acc, prod)
            if level and self.scale_exponent:
                acc = dsa.mul(acc, 2.0 ** (-self.scale_exponent * level))
            total = acc if total is None else dsa.add(total, acc)
        shift = -(sa.reshape(-1, 1) + sb.reshape(1, -1))
        assert total is not None  # every type has at least one slice pair
        _charge(dsa, "unscale", total.size, 2 * total.nbytes)
        # one correctly rounded scaling; exact unless the entry is float32-subnormal
        with np.errstate(under="ignore"):
            return np.ldexp(total, shift.astype(np.int32))

    def error_bound(self, k: int) -> float:
        """Componentwise: |C - AB| <= bound * |A||B| on every input `fits_range` accepts.

        With u the narrow unit roundoff and s pieces: |p_i| <= (1+u) u^i |a| and the split
        residual is <= u^s |a| (both checked per entry on the scaled data), so dropping it
        costs 2u^s + u^2s; each dropped pair (i, j) at most (1+u)^2 u^(i+j); each kept
        product's FP32 accumulation gamma_k times its size; the P - 1 merge additions
        gamma_(P-1) times the computed terms. Power-of-two scaling is exact; 2^-40 covers a
        result that rounds in float32's subnormal range (see _F32_OUT_MIN).
        """
        u = formats.get_format(self.native).unit_roundoff
        s = self.pieces
        kept = sum((1 + u) ** 2 * u ** (i + j) for i, j in self.pairs)
        dropped = sum(
            (1 + u) ** 2 * u ** (i + j)
            for i in range(s)
            for j in range(s)
            if (i, j) not in self.pairs
        )
        g_k = _gamma(k, U32)
        merge = _gamma(len(self.pairs) - 1, U32) * (1 + g_k)
        return 2 * u**s + u ** (2 * s) + dropped + (g_k + merge) * kept + _F32_UNDERFLOW


def _pairs_upto(s: int, max_level: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, j) for i in range(s) for j in range(s) if i + j <= max_level)


# --------------------------------------------------------------------------------------
# INT16 from four int8 GEMMs (Ape section 2.1-2.2)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Int16Type(EmulatedType):
    """x = 256 h + l (signed bytes); C = 2^16 hh + 2^8 (hl + lh) + ll, exact in int64.

    Ape keeps C in int32 (exact modulo 2^32); here the merge is done exactly in int64 on the
    host, charged as 4 integer vector ops per output element. Integers have no NaN, so
    non-finite floats are a range problem here, not propagated.
    """

    propagates_nonfinite: ClassVar[bool] = False
    range_from_stats: ClassVar[bool] = False

    def _operands(self, A, B):
        A, B = _check_shapes(A, B, self.name)
        for label, X in (("A", A), ("B", B)):
            if X.dtype.kind not in "iuf":
                raise TypeError(f"{self.name}: {label} must hold integers, got {X.dtype}")
        return A, B

    def _finite_range_problem(self, A, B):
        for X in (A, B):
            if X.size == 0:
                continue
            if X.dtype.kind == "f":
                if not np.all(np.isfinite(X)) or np.any(X != np.trunc(X)):
                    break
            if X.min() < splits.INT16C_MIN or X.max() > splits.INT16C_MAX:
                break
        else:
            return None
        return (f"inputs must be integers in [{splits.INT16C_MIN}, {splits.INT16C_MAX}] "
                "(two signed bytes)")

    def _gemm(self, A, B, dsa: DSA) -> np.ndarray:
        m, n = A.shape[0], B.shape[1]
        ah, al = splits.split_int16_to_int8(A)
        bh, bl = splits.split_int16_to_int8(B)
        elems = A.size + B.size
        _charge(dsa, "split_int16", 2 * elems, 4 * elems)  # mask and shift per element
        hh = _mm_int8_blocked(dsa, ah, bh)
        hl = _mm_int8_blocked(dsa, ah, bl)
        lh = _mm_int8_blocked(dsa, al, bh)
        ll = _mm_int8_blocked(dsa, al, bl)
        _charge(dsa, "merge_int16", 4 * m * n, 4 * 4 * m * n + 8 * m * n)
        return (hh << 16) + ((hl + lh) << 8) + ll

    def error_bound(self, k: int) -> float:
        """Exact: 0."""
        return 0.0


# --------------------------------------------------------------------------------------
# Ozaki schemes on the int8 unit (design note 4.2, 6.3)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _OzakiType(EmulatedType):
    """What both Ozaki schemes share: float64 operands on an int8 matrix unit; any finite data
    whose product stays inside float64's range (accuracy, not correctness, degrades with the
    exponent spread per row)."""

    bound_kind: ClassVar[str] = "operand-normwise"

    def _operands(self, A, B):
        return _float_operands(A, B, self.name, np.float64)

    def stats_problem(self, st: OperandStats) -> str | None:
        low = float(np.max(st.row_max, initial=0.0) * np.max(st.col_max, initial=0.0))
        top = low * st.k
        if top >= _F64_OUT_MAX:
            return f"k max|A| max|B| = {top:.3g} >= 2^1020: the product may overflow float64"
        if 0 < low < _F64_OUT_MIN:
            return (f"max|A| max|B| = {low:.3g} < 2^-900: the result rounds in float64's "
                    "subnormal range, beyond the bound")
        return None


@dataclass(frozen=True)
class _Ozaki1Type(_OzakiType):
    """Ozaki scheme I: s int8 slices of beta(k) bits, the s(s+1)/2 pairs with i+j <= s+1.

    Slice pairs of one level are summed exactly in int64 (each product is exact int32), and
    each level, an integer below 2^53 times a power of two, is exact in float64. The levels
    are then added without losing what they hold: a compensated (double-double) sum from
    the most significant level down, TwoSum on the leading part and the rounding errors
    collected in a second float64 (Ogita, Rump, Oishi, "Accurate sum and dot product", SIAM
    J. Sci. Comput. 26(6), 2005, Sum2), one final rounding. A plain float64 sum, smallest
    first, loses u64 of the partial sums at every level, and those are as large as the
    rows' scale: entries much smaller than (|A||B|)_ij then stopped improving at about 1e-13
    relative to themselves from s = 10 on. Ootomo, Ozaki, Yokota (IJHPCA 2024, ozIMMU_EF)
    accumulate error-free likewise. A DSA without fp64 would do this in double-float on its
    FP32 vector unit (section 6.3); it is charged as such: one conversion plus a 20-flop
    DWPlusDW per output element and level.
    """

    slices: int = 8
    # False: the old plain float64 sum of the levels, smallest first (kept only to measure
    # what the compensated sum gains; its error_bound does not cover that variant)
    compensated: bool = True

    def _gemm(self, A64, B64, dsa: DSA) -> np.ndarray:
        m, k = A64.shape
        n = B64.shape[1]
        s = self.slices
        beta = splits.ozaki1_beta(k)
        sa = splits.ozaki_slices(A64, s, beta, axis=1)
        sb = splits.ozaki_slices(B64, s, beta, axis=0)
        elems = A64.size + B64.size
        # row/column max and scaling (2), then per slice multiply, truncate, subtract (3)
        _charge(dsa, "split_ozaki1", (2 + 3 * s) * elems, (8 + s) * elems)
        levels = []
        for level in range(s):
            part = np.zeros((m, n), dtype=np.int64)
            for i in range(level + 1):
                part += dsa.mm_int8(sa.slices[i], sb.slices[level - i]).astype(np.int64)
            # |part| <= (level+1) k 4^beta < 2^53: the conversion and the scaling are exact
            levels.append(np.ldexp(part.astype(np.float64), -beta * (level + 2)))
        if self.compensated:
            hi, lo = splits.compensated_sum(levels)
            total = hi + lo
        else:
            total = np.zeros((m, n), dtype=np.float64)
            for level_sum in reversed(levels):
                total = total + level_sum
        _charge(dsa, "merge_ozaki1", 21 * s * m * n + 2 * m * n, (4 * s + 16) * m * n)
        shift = sa.exponents.reshape(-1, 1) + sb.exponents.reshape(1, -1)
        with np.errstate(under="ignore"):
            return np.ldexp(total, shift)

    def error_bound(self, k: int) -> float:
        """Operand-normwise: ||C - AB||_F <= bound ||A||_F ||B||_F.

        Per entry, relative to ||a_i||_2 ||b_j||_2 (2^e <= 2 max|a_i| <= 2||a_i||): slice
        truncation < 2^(e - s beta) per element gives 4 sqrt(k) 2^(-s beta); a dropped pair
        at level L (0-based i + j = L >= s) is < 4 k 2^(-beta L); the compensated sum of the
        s exact levels, each of size <= (L+1) (slices are truncations, |slice| <= |a|), errs
        by u64 |C_ij| <= u64 + gamma_(s-1)^2 s(s+1)/2 (Sum2's bound); 2^-100 covers an
        output in float64's subnormal range. Summing the squares over (i, j) gives the
        Frobenius form. Per entry the error is thus about u64 |C_ij| plus the truncation,
        which `tests/emulation/test_types.py` checks elementwise.
        """
        s = self.slices
        beta = splits.ozaki1_beta(k)
        trunc = 4 * math.sqrt(k) * 2.0 ** (-s * beta)
        dropped = 4 * k * sum((2 * s - 1 - L) * 2.0 ** (-beta * L) for L in range(s, 2 * s - 1))
        merge = U64 + _gamma(s - 1, U64) ** 2 * s * (s + 1) / 2
        return trunc + dropped + merge + _F64_UNDERFLOW


@dataclass(frozen=True)
class _Ozaki2Type(_OzakiType):
    """Ozaki scheme II: scale to integers, N int8 residue GEMMs, Garner CRT, unscale.

    The CRT is exact because the GEMMul8 fast-mode scaling keeps |A'B'| < P/2; Garner's
    digits are int64 and the Horner evaluation float64 on the host (a fp64-less DSA would
    use double-float there, charged as such: per output element ~3 int ops per Garner step
    and a 20-flop double-float multiply-add per Horner step). Horner from the most
    significant balanced digit loses no more than a few u64 of the entry itself
    (`splits.crt_reconstruct`), so the accumulation adds nothing like Ozaki I's old loss.
    """

    moduli: int = 16

    def _gemm(self, A64, B64, dsa: DSA) -> np.ndarray:
        m, n = A64.shape[0], B64.shape[1]
        N = self.moduli
        mods = splits.crt_moduli(N)
        sa, sb = splits.ozaki2_scaling(A64, B64, N)
        Ai = splits.scale_to_integers(A64, sa, axis=1)
        Bi = splits.scale_to_integers(B64, sb, axis=0)
        residues = []
        for p in mods:
            ra = splits.to_residues(Ai, p)
            rb = splits.to_residues(Bi, p)
            residues.append(_mm_int8_blocked(dsa, ra, rb))
        elems = A64.size + B64.size
        # norms and scaling (4 per element), then a limb-wise residue (4) per modulus
        _charge(dsa, "split_ozaki2", (4 + 4 * N) * elems, (8 + N) * elems)
        C = splits.crt_reconstruct(residues, mods)
        garner = 3 * N * (N - 1) // 2 + 2 * N
        _charge(dsa, "merge_ozaki2", (garner + 20 * N) * m * n, (4 * N + 8) * m * n)
        with np.errstate(under="ignore"):
            return np.ldexp(C, -(sa.reshape(-1, 1) + sb.reshape(1, -1)))

    def error_bound(self, k: int) -> float:
        """Operand-normwise: ||C - AB||_F <= bound ||A||_F ||B||_F.

        With h = (log2 P - 1.5)/2, 2^-sa <= 2^(1-h) ||a_i||_2. The truncation to integers
        (< 1 per element before unscaling) costs sqrt(k) 2^(2-h) + k 2^(2-2h) per entry
        relative to ||a_i|| ||b_j||; the CRT is exact; Horner's float64 evaluation of the
        balanced mixed-radix digits errs by gamma_2N sum |v_i| prod p_j <= gamma_2N P,
        i.e. gamma_2N 2^3.5 after unscaling (a loose, worst-case term); 2^-100 covers an
        output in float64's subnormal range.
        """
        log2P = sum(math.log2(p) for p in splits.crt_moduli(self.moduli))
        h = (log2P - 1.5) / 2
        trunc = math.sqrt(k) * 2.0 ** (2 - h) + k * 2.0 ** (2 - 2 * h)
        horner = _gamma(2 * self.moduli, U64) * 2.0**3.5
        return trunc + horner + _F64_UNDERFLOW


def ozaki1(s: int, *, compensated: bool = True) -> EmulatedType:
    """Ozaki scheme I with s int8 slices ("OZ1-S{s}"), s(s+1)/2 int8 GEMMs.

    ``compensated=False`` builds the plain-float64-sum variant ("OZ1-S{s}-plain"), an
    ablation for measurements only: its levels lose u64 of the running sum each.
    """
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 18:
        raise ValueError(f"ozaki1: s must be an int in [1, 18], got {s!r}")
    return _Ozaki1Type(
        name=f"OZ1-S{s}" + ("" if compensated else "-plain"),
        family="fp64",
        native="int8",
        native_gemms=s * (s + 1) // 2,
        description=f"Ozaki scheme I: {s} int8 slices of beta(k) <= 7 bits, pairs i+j <= "
        f"{s + 1}, levels summed {'error-free' if compensated else 'plainly (ablation)'}; "
        "any finite data, accuracy drops with exponent spread within rows",
        slices=s,
        compensated=compensated,
    )


def ozaki2(N: int) -> EmulatedType:
    """Ozaki scheme II with N moduli ("OZ2-N{N}"), N int8 GEMMs."""
    if isinstance(N, bool) or not isinstance(N, int) or not 2 <= N <= 20:
        raise ValueError(f"ozaki2: N must be an int in [2, 20], got {N!r}")
    return _Ozaki2Type(
        name=f"OZ2-N{N}",
        family="fp64",
        native="int8",
        native_gemms=N,
        description=f"Ozaki scheme II: CRT over {N} coprime moduli <= 256 (about "
        f"{sum(math.log2(p) for p in splits.crt_moduli(N)) / 2 - 0.75:.0f} bits per "
        "operand row/column); any finite data",
        moduli=N,
    )


# --------------------------------------------------------------------------------------
# DF32: double-float dot products on the FP32 vector unit (design note 4.3)
# --------------------------------------------------------------------------------------

# Dekker TwoProd (17 flops without FMA) + DWPlusDW (20) per multiply-add of float32 pairs
_DF_FLOPS_PER_MAC = 37


@dataclass(frozen=True)
class _DoubleFloatType(EmulatedType):
    """a = ah + al (float32 pair), C_ij = sum over the four pair products in double-float.

    The four products ah bh, ah bl, al bh, al bl become one splits.df_dot over a 4k-long
    vector, so nothing but float32 vector arithmetic touches the data (no matrix unit). The
    float64 -> pair conversion is the boundary format change, charged 3 ops per element.
    """

    def _operands(self, A, B):
        return _float_operands(A, B, self.name, np.float64)

    def stats_problem(self, st: OperandStats) -> str | None:
        for top, low in ((st.row_max, st.row_min), (st.col_max, st.col_min)):
            if np.max(top, initial=0.0) > DF32_MAX or np.min(low, initial=np.inf) < DF32_MIN:
                return ("nonzero |x| must lie in [2^-40, 2^40] (fp32 exponent range of "
                        "double-float pieces and their products)")
        return None

    def _gemm(self, A64, B64, dsa: DSA) -> np.ndarray:
        m, k = A64.shape
        n = B64.shape[1]
        ah = A64.astype(np.float32)
        al = (A64 - ah).astype(np.float32)
        bh = B64.astype(np.float32)
        bl = (B64 - bh).astype(np.float32)
        elems = A64.size + B64.size
        _charge(dsa, "split_df32", 3 * elems, 16 * elems)
        # smallest products first: al bl, al bh, ah bl, ah bh
        x = np.concatenate([al, al, ah, ah], axis=1)
        y = np.concatenate([bl, bh, bl, bh], axis=0)
        with np.errstate(under="ignore"):
            hi, lo = splits.df_dot(x[:, None, :], y.T[None, :, :], axis=-1)
        _charge(dsa, "df_dot", _DF_FLOPS_PER_MAC * 4 * m * n * k, 8 * (elems + m * n))
        return hi.astype(np.float64) + lo.astype(np.float64)

    def error_bound(self, k: int) -> float:
        """Componentwise: |C - AB| <= bound |A||B| inside the range (JMP 2017 bounds).

        Pair residual 2u^2 + u^4 (u = 2^-24); df_dot over K = 4k terms errs by
        (K-1) eps (1+eps)^K sum|x y| with eps = 3u^2 + 13u^3 and sum|x y| <= (1+u)^4 |a||b|;
        the final float64 sum of the pair adds u64; 2^-60 covers the subnormal low parts
        that the [2^-40, 2^40] range still allows.
        """
        u = U32
        K = 4 * k
        eps = 3 * u**2 + 13 * u**3
        dot = (K - 1) * eps * (1 + eps) ** K * (1 + u) ** 4
        return 2 * u**2 + u**4 + dot * (1 + U64) + U64 + 2.0**-60


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def _float_type(name, family, native, pieces, scale, pairs, description, **kw):
    return _SplitFloatType(
        name=name,
        family=family,
        native=native,
        native_gemms=len(pairs),
        description=description,
        pieces=pieces,
        scale_exponent=scale,
        pairs=pairs,
        **kw,
    )


def _build_types() -> list[EmulatedType]:
    # fp16 row maxima go to [2^14, 2^15): below FP32F_MAX, where Ape's low part overflows
    fp16 = {"top": 15}
    scaled = "rows/columns scaled by powers of two"
    spread = "limited by the spread of magnitudes within a row/column"
    return [
        _float_type("BF16", "narrow", "bf16", 1, 0, ((0, 0),),
                    f"{scaled}, rounded to bf16, one bf16 GEMM (~8 bits)"),
        _float_type("TF32", "narrow", "tf32", 1, 0, ((0, 0),),
                    f"{scaled}, rounded to tf32, one tf32 GEMM (~11 bits)"),
        _float_type("FP16", "narrow", "fp16", 1, 0, ((0, 0),),
                    f"{scaled} (maxima into [2^14, 2^15)), rounded to fp16, one fp16 GEMM; "
                    f"{spread} (about 2^28)", **fp16),
        _float_type("BF16x2", "fp32", "bf16", 2, 0, _pairs_upto(2, 1),
                    f"{scaled}, two bf16 pieces, 3 products (~16 bits)"),
        _float_type("FP32-F", "fp32", "fp16", 2, 12, _pairs_upto(2, 1),
                    "Ape FP32-F: fp16 high + fp16 low * 2^12, hh + (hl + lh)/2^12, "
                    f"{scaled} (maxima into [2^14, 2^15)); {spread} (about 2^28)", **fp16),
        _float_type("FP32-T", "fp32", "tf32", 2, 0, _pairs_upto(2, 1),
                    "Ape FP32-T / 3xTF32: two explicitly rounded tf32 pieces, 3 products, "
                    f"{scaled}"),
        _float_type("FP32-B", "fp32", "bf16", 3, 0, _pairs_upto(3, 2),
                    "Ape FP32-B: three bf16 pieces, the 6 products with i+j <= 2, "
                    f"{scaled}"),
        _float_type("FP32-B9", "fp32", "bf16", 3, 0, _pairs_upto(3, 4),
                    f"three bf16 pieces, all 9 products (cuBLAS BF16x9), {scaled}"),
        _Int16Type(
            name="INT16",
            family="int16",
            native="int8",
            native_gemms=4,
            description="Ape INT16: signed high/low bytes, 4 int8 GEMMs, exact; integers in "
            f"[{splits.INT16C_MIN}, {splits.INT16C_MAX}]",
        ),
        ozaki1(6),
        ozaki1(7),
        ozaki1(8),
        ozaki2(8),
        ozaki2(12),
        ozaki2(14),
        ozaki2(16),
        _DoubleFloatType(
            name="DF32",
            family="fp64",
            native="vector",
            native_gemms=0,
            description="double-float (float32 pair) dot products on the FP32 vector unit, "
            "~46 bits; nonzero |x| in [2^-40, 2^40]",
        ),
    ]


def _typical_cost(t: EmulatedType) -> float:
    """Seconds per 2mnk flops of one emulated GEMM on the A100 profile (the 'typical' one)."""
    profile = a100_dsa()
    if t.native == "vector":
        assert profile.vector_fp32_flops is not None  # the A100 profile has vector units
        return 4 * _DF_FLOPS_PER_MAC / 2 / profile.vector_fp32_flops
    return t.native_gemms / profile.matrix_peak_ops[t.native]


# cheapest first on the A100 profile; ties keep the catalogue order above
TYPES: dict[str, EmulatedType] = {
    t.name: t for t in sorted(_build_types(), key=_typical_cost)
}


def get_type(name: str) -> EmulatedType:
    """A type by name; "OZ1-S{s}" and "OZ2-N{N}" outside the registry are built on demand."""
    if name in TYPES:
        return TYPES[name]
    for prefix, make in (("OZ1-S", ozaki1), ("OZ2-N", ozaki2)):
        if isinstance(name, str) and name.startswith(prefix) and name[len(prefix):].isdigit():
            return make(int(name[len(prefix):]))
    raise ValueError(f"unknown emulated type {name!r}; known: {list(TYPES)}")


def bound_metric(etype: EmulatedType, C, C_ref, A, B) -> float:
    """The observed error in the metric ``etype.error_bound`` bounds (see module doc)."""
    from furnace.emulation import naive

    if etype.bound_kind == "componentwise":
        return naive.componentwise_error(C, C_ref, A, B)

    def norm(X) -> np.longdouble:
        # scaled by the largest entry, so squares of tiny or huge data neither under- nor
        # overflow
        X = np.asarray(X, dtype=np.longdouble)
        peak = np.max(np.abs(X), initial=np.longdouble(0))
        return peak * np.sqrt(np.sum((X / peak) ** 2)) if peak > 0 else np.longdouble(0)

    num = norm(np.asarray(C, dtype=np.longdouble) - np.asarray(C_ref, dtype=np.longdouble))
    den = norm(A) * norm(B)
    return float(num / den) if den else (0.0 if num == 0 else math.inf)
