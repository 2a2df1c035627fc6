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

Error bounds (``error_bound(k)``) are a priori and assume no underflow of pieces and no
overflow. ``bound_kind`` says which metric a type's bound is about:

* "componentwise": max_ij |C - AB|_ij / (|A||B|)_ij  (fp32 family, narrow, INT16, DF32);
* "operand-normwise": ||C - AB||_F / (||A||_F ||B||_F)  (Ozaki schemes, whose accuracy is
  relative to the row/column scale, not to each entry: section 4.2's exponent-spread loss).

`bound_metric` evaluates the matching observed quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from furnace.emulation import formats, splits
from furnace.emulation.dsa import DSA, INT32_MAX, NotNativeError
from furnace.runtime.presets import a100_dsa

__all__ = [
    "TYPES",
    "EmulatedType",
    "RangeError",
    "bound_metric",
    "get_type",
    "ozaki1",
    "ozaki2",
]

U32 = 2.0**-24
U64 = 2.0**-53
# Ape FP32-F: fp16 pieces of |x| in [2^15, 2^16) have ulp 32, and a residual of up to 16
# scaled by 2^12 reaches 65536 > 65504 (splits.split_float); so the safe range is < 2^15
FP32F_MAX = 2.0**15
# DF32 keeps fp32's exponent range: inside [2^-40, 2^40] the low halves and cross products
# stay clear of fp32 under/overflow well enough for the bound (see _DoubleFloatType)
DF32_MIN = 2.0**-40
DF32_MAX = 2.0**40
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
    """A, B as `dtype` without rounding (a silent rounding would hide an error), finite."""
    A, B = _check_shapes(A, B, name)
    out = []
    for label, X in (("A", A), ("B", B)):
        if X.dtype.kind not in "fiu" or (X.dtype.kind == "f" and X.dtype.itemsize > 8):
            raise TypeError(f"{name}: {label} must be real float32/float64 data, got {X.dtype}")
        Y = X.astype(dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            same = Y.astype(np.float64) == X.astype(np.float64)
        if not np.all(same | ~np.isfinite(X)):
            raise TypeError(
                f"{name}: {label} holds values that are not exact in {np.dtype(dtype).name}; "
                f"this type takes {np.dtype(dtype).name} inputs"
            )
        if not np.all(np.isfinite(Y)):
            raise RangeError(f"{name}: {label} holds non-finite values")
        out.append(Y)
    return out[0], out[1]


def _max_abs(X) -> float:
    X = np.asarray(X, dtype=np.float64)
    return float(np.max(np.abs(X), initial=0.0))


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


@dataclass(frozen=True)
class EmulatedType:
    """One emulated GEMM type: its name, family, native unit and cost, and its algorithm.

    ``family``: "fp32" | "fp64" | "int16" | "narrow"; ``native``: "fp16" | "bf16" | "tf32" |
    "int8" | "vector"; ``native_gemms``: matrix-unit GEMMs per emulated GEMM.
    """

    name: str
    family: str
    native: str
    native_gemms: int
    description: str

    bound_kind: ClassVar[str] = "componentwise"

    def gemm(self, A: np.ndarray, B: np.ndarray, dsa: DSA) -> np.ndarray:
        """A @ B emulated on ``dsa``; float32 / float64 / int64 result by family."""
        raise NotImplementedError

    def fits_range(self, *arrays) -> bool:
        """Whether every array is inside the range the type handles (zeros always are)."""
        raise NotImplementedError

    def error_bound(self, k: int) -> float:
        """A-priori bound for inner dimension k, in the metric named by ``bound_kind``."""
        raise NotImplementedError

    def _require_native(self, dsa: DSA) -> None:
        if self.native == "vector":
            return
        if self.native not in dsa.matrix_formats:
            raise NotNativeError(
                f"{self.name} needs a {self.native} matrix unit; {dsa.profile.name} has "
                f"{sorted(dsa.matrix_formats)}"
            )

    def _require_range(self, *arrays) -> None:
        if not self.fits_range(*arrays):
            raise RangeError(f"{self.name}: inputs outside its range ({self.description})")


# --------------------------------------------------------------------------------------
# float splits on fp16 / bf16 / tf32 matrix units (Ape section 2.1, design note 6.3)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SplitFloatType(EmulatedType):
    """x = sum_i p_i 2^(-i s) (narrow pieces); C = sum over kept pairs of p_i q_j 2^(-(i+j)s).

    Products of one level i + j are added first, levels from the smallest up (section 6.9:
    accumulate small terms first), each level scaled back by an exact power of two on the
    vector unit.
    """

    pieces: int = 1
    scale_exponent: int = 0
    pairs: tuple[tuple[int, int], ...] = ((0, 0),)
    limit: float = math.inf
    limit_inclusive: bool = True

    def fits_range(self, *arrays) -> bool:
        for X in arrays:
            X = np.asarray(X)
            if X.size == 0:
                continue
            if not np.all(np.isfinite(X)):
                return False
            top = _max_abs(X)
            if top > self.limit or (top == self.limit and not self.limit_inclusive):
                return False
        return True

    def gemm(self, A, B, dsa: DSA) -> np.ndarray:
        A32, B32 = _float_operands(A, B, self.name, np.float32)
        self._require_native(dsa)
        self._require_range(A32, B32)
        m, k = A32.shape
        n = B32.shape[1]
        if k == 0:
            return np.zeros((m, n), dtype=np.float32)
        a = splits.split_float(A32, self.native, self.pieces, self.scale_exponent).pieces
        b = splits.split_float(B32, self.native, self.pieces, self.scale_exponent).pieces
        # per element and piece: one rounding conversion, one subtraction, one scaling
        elems = A32.size + B32.size
        _charge(
            dsa, f"split_{self.native}", 3 * self.pieces * elems,
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
        return total

    def error_bound(self, k: int) -> float:
        """Componentwise: |C - AB| <= bound * |A||B|, pieces normal, nothing overflowing.

        With u the narrow unit roundoff and s pieces: |p_i| <= (1+u) u^i |a| and the split
        residual is <= u^s |a|, so dropping it costs 2u^s + u^2s; each dropped pair (i, j)
        at most (1+u)^2 u^(i+j); each kept product's FP32 accumulation gamma_k times its
        size; the P - 1 merge additions gamma_(P-1) times the computed terms.
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
        return 2 * u**s + u ** (2 * s) + dropped + (g_k + merge) * kept


def _pairs_upto(s: int, max_level: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, j) for i in range(s) for j in range(s) if i + j <= max_level)


# --------------------------------------------------------------------------------------
# INT16 from four int8 GEMMs (Ape section 2.1-2.2)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Int16Type(EmulatedType):
    """x = 256 h + l (signed bytes); C = 2^16 hh + 2^8 (hl + lh) + ll, exact in int64.

    Ape keeps C in int32 (exact modulo 2^32); here the merge is done exactly in int64 on the
    host, charged as 4 integer vector ops per output element.
    """

    def fits_range(self, *arrays) -> bool:
        for X in arrays:
            X = np.asarray(X)
            if X.size == 0:
                continue
            if X.dtype.kind == "f":
                if not np.all(np.isfinite(X)) or np.any(X != np.trunc(X)):
                    return False
            elif X.dtype.kind not in "iu":
                return False
            if X.min() < splits.INT16C_MIN or X.max() > splits.INT16C_MAX:
                return False
        return True

    def gemm(self, A, B, dsa: DSA) -> np.ndarray:
        A, B = _check_shapes(A, B, self.name)
        self._require_native(dsa)
        for label, X in (("A", A), ("B", B)):
            if X.dtype.kind not in "iuf":
                raise TypeError(f"{self.name}: {label} must hold integers, got {X.dtype}")
        if not self.fits_range(A, B):
            raise RangeError(
                f"{self.name}: inputs must be integers in [{splits.INT16C_MIN}, "
                f"{splits.INT16C_MAX}] (two signed bytes)"
            )
        m, k = A.shape
        n = B.shape[1]
        if k == 0:
            return np.zeros((m, n), dtype=np.int64)
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


def _fp64_range_ok(*arrays) -> bool:
    for X in arrays:
        X = np.asarray(X)
        if X.size == 0:
            continue
        if X.dtype.kind not in "fiu" or not np.all(np.isfinite(X.astype(np.float64))):
            return False
    return True


@dataclass(frozen=True)
class _OzakiType(EmulatedType):
    """What both Ozaki schemes share: float64 operands on an int8 matrix unit, any finite data
    (accuracy, not correctness, degrades with the exponent spread per row)."""

    bound_kind: ClassVar[str] = "operand-normwise"

    def fits_range(self, *arrays) -> bool:
        return _fp64_range_ok(*arrays)

    def gemm(self, A, B, dsa: DSA) -> np.ndarray:
        A64, B64 = _float_operands(A, B, self.name, np.float64)
        self._require_native(dsa)
        if A64.shape[1] == 0:
            return np.zeros((A64.shape[0], B64.shape[1]), dtype=np.float64)
        return self._int8_gemm(A64, B64, dsa)

    def _int8_gemm(self, A64: np.ndarray, B64: np.ndarray, dsa: DSA) -> np.ndarray:
        """The scheme itself, for checked float64 operands with k >= 1."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Ozaki1Type(_OzakiType):
    """Ozaki scheme I: s int8 slices of beta(k) bits, the s(s+1)/2 pairs with i+j <= s+1.

    Slice pairs of one level are summed exactly in int64 (each product is exact int32);
    levels are then added in float64 on the host, smallest first. A DSA without fp64 would do
    this accumulation in double-float on its FP32 vector unit (section 6.3); it is charged
    as such: one conversion plus a 20-flop DWPlusDW per output element and level.
    """

    slices: int = 8

    def _int8_gemm(self, A64, B64, dsa: DSA) -> np.ndarray:
        m, k = A64.shape
        n = B64.shape[1]
        s = self.slices
        beta = splits.ozaki1_beta(k)
        sa = splits.ozaki_slices(A64, s, beta, axis=1)
        sb = splits.ozaki_slices(B64, s, beta, axis=0)
        elems = A64.size + B64.size
        # row/column max and scaling (2), then per slice multiply, truncate, subtract (3)
        _charge(dsa, "split_ozaki1", (2 + 3 * s) * elems, (8 + s) * elems)
        acc = np.zeros((m, n), dtype=np.float64)
        for level in range(s - 1, -1, -1):
            part = np.zeros((m, n), dtype=np.int64)
            for i in range(level + 1):
                part += dsa.mm_int8(sa.slices[i], sb.slices[level - i]).astype(np.int64)
            # |part| <= (level+1) k 4^beta < 2^53: the conversion and the scaling are exact
            acc += np.ldexp(part.astype(np.float64), -beta * (level + 2))
        _charge(dsa, "merge_ozaki1", 21 * s * m * n + 2 * m * n, (4 * s + 16) * m * n)
        return np.ldexp(acc, sa.exponents.reshape(-1, 1) + sb.exponents.reshape(1, -1))

    def error_bound(self, k: int) -> float:
        """Operand-normwise: ||C - AB||_F <= bound ||A||_F ||B||_F.

        Per entry, relative to ||a_i||_2 ||b_j||_2 (2^e <= 2 max|a_i| <= 2||a_i||): slice
        truncation < 2^(e - s beta) per element gives 4 sqrt(k) 2^(-s beta); a dropped pair
        at level L (0-based i + j = L >= s) is < 4 k 2^(-beta L); the float64 sum of s
        levels, each of size <= (L+1) (slices are truncations, |slice| <= |a|), adds
        gamma_s s(s+1)/2. Summing the squares over (i, j) gives the Frobenius form.
        """
        s = self.slices
        beta = splits.ozaki1_beta(k)
        trunc = 4 * math.sqrt(k) * 2.0 ** (-s * beta)
        dropped = 4 * k * sum((2 * s - 1 - L) * 2.0 ** (-beta * L) for L in range(s, 2 * s - 1))
        merge = _gamma(s, U64) * s * (s + 1) / 2
        return trunc + dropped + merge


@dataclass(frozen=True)
class _Ozaki2Type(_OzakiType):
    """Ozaki scheme II: scale to integers, N int8 residue GEMMs, Garner CRT, unscale.

    The CRT is exact because the GEMMul8 fast-mode scaling keeps |A'B'| < P/2; Garner's
    digits are int64 and the Horner evaluation float64 on the host (a fp64-less DSA would
    use double-float there, charged as such: per output element ~3 int ops per Garner step
    and a 20-flop double-float multiply-add per Horner step).
    """

    moduli: int = 16

    def _int8_gemm(self, A64, B64, dsa: DSA) -> np.ndarray:
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
        return np.ldexp(C, -(sa.reshape(-1, 1) + sb.reshape(1, -1)))

    def error_bound(self, k: int) -> float:
        """Operand-normwise: ||C - AB||_F <= bound ||A||_F ||B||_F.

        With h = (log2 P - 1.5)/2, 2^-sa <= 2^(1-h) ||a_i||_2. The truncation to integers
        (< 1 per element before unscaling) costs sqrt(k) 2^(2-h) + k 2^(2-2h) per entry
        relative to ||a_i|| ||b_j||; the CRT is exact; Horner's float64 evaluation of the
        balanced mixed-radix digits errs by gamma_2N sum |v_i| prod p_j <= gamma_2N P,
        i.e. gamma_2N 2^3.5 after unscaling (a loose, worst-case term).
        """
        log2P = sum(math.log2(p) for p in splits.crt_moduli(self.moduli))
        h = (log2P - 1.5) / 2
        trunc = math.sqrt(k) * 2.0 ** (2 - h) + k * 2.0 ** (2 - 2 * h)
        horner = _gamma(2 * self.moduli, U64) * 2.0**3.5
        return trunc + horner


def ozaki1(s: int) -> EmulatedType:
    """Ozaki scheme I with s int8 slices ("OZ1-S{s}"), s(s+1)/2 int8 GEMMs."""
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 18:
        raise ValueError(f"ozaki1: s must be an int in [1, 18], got {s!r}")
    return _Ozaki1Type(
        name=f"OZ1-S{s}",
        family="fp64",
        native="int8",
        native_gemms=s * (s + 1) // 2,
        description=f"Ozaki scheme I: {s} int8 slices of beta(k) <= 7 bits, pairs i+j <= "
        f"{s + 1}; any finite data, accuracy drops with exponent spread within rows",
        slices=s,
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

    def fits_range(self, *arrays) -> bool:
        for X in arrays:
            X = np.asarray(X)
            if X.size == 0:
                continue
            if X.dtype.kind not in "fiu":
                return False
            Xa = np.abs(X.astype(np.float64))
            if not np.all(np.isfinite(Xa)) or np.max(Xa) > DF32_MAX:
                return False
            if np.any((Xa > 0) & (Xa < DF32_MIN)):
                return False
        return True

    def gemm(self, A, B, dsa: DSA) -> np.ndarray:
        A64, B64 = _float_operands(A, B, self.name, np.float64)
        if not self.fits_range(A64, B64):
            raise RangeError(
                f"{self.name}: nonzero |x| must lie in [2^-40, 2^40] (fp32 exponent range "
                "of double-float pieces and their products)"
            )
        m, k = A64.shape
        n = B64.shape[1]
        if k == 0:
            return np.zeros((m, n), dtype=np.float64)
        ah = A64.astype(np.float32)
        al = (A64 - ah).astype(np.float32)
        bh = B64.astype(np.float32)
        bl = (B64 - bh).astype(np.float32)
        elems = A64.size + B64.size
        _charge(dsa, "split_df32", 3 * elems, 16 * elems)
        # smallest products first: al bl, al bh, ah bl, ah bh
        x = np.concatenate([al, al, ah, ah], axis=1)
        y = np.concatenate([bl, bh, bl, bh], axis=0)
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
    bf16 = formats.BF16.max_finite
    tf32 = formats.TF32.max_finite
    return [
        _float_type("BF16", "narrow", "bf16", 1, 0, ((0, 0),),
                    "inputs rounded to bf16, one bf16 GEMM (~8 bits)", limit=bf16),
        _float_type("TF32", "narrow", "tf32", 1, 0, ((0, 0),),
                    "inputs rounded to tf32, one tf32 GEMM (~11 bits)", limit=tf32),
        _float_type("FP16", "narrow", "fp16", 1, 0, ((0, 0),),
                    "inputs rounded to fp16, one fp16 GEMM; |x| <= 65504",
                    limit=formats.FP16.max_finite),
        _float_type("BF16x2", "fp32", "bf16", 2, 0, _pairs_upto(2, 1),
                    "two bf16 pieces, 3 products (~16 bits)", limit=bf16),
        _float_type("FP32-F", "fp32", "fp16", 2, 12, _pairs_upto(2, 1),
                    "Ape FP32-F: fp16 high + fp16 low * 2^12, hh + (hl + lh)/2^12; "
                    "|x| < 2^15", limit=FP32F_MAX, limit_inclusive=False),
        _float_type("FP32-T", "fp32", "tf32", 2, 0, _pairs_upto(2, 1),
                    "Ape FP32-T / 3xTF32: two explicitly rounded tf32 pieces, 3 products",
                    limit=tf32),
        _float_type("FP32-B", "fp32", "bf16", 3, 0, _pairs_upto(3, 2),
                    "Ape FP32-B: three bf16 pieces, the 6 products with i+j <= 2; full "
                    "fp32 range (third piece subnormal below ~1e-33)", limit=bf16),
        _float_type("FP32-B9", "fp32", "bf16", 3, 0, _pairs_upto(3, 4),
                    "three bf16 pieces, all 9 products (cuBLAS BF16x9)", limit=bf16),
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
    diff = np.asarray(C, dtype=np.longdouble) - np.asarray(C_ref, dtype=np.longdouble)
    num = float(np.sqrt(np.sum(diff * diff)))
    norm_a = np.linalg.norm(np.asarray(A, dtype=np.float64))
    den = float(norm_a * np.linalg.norm(np.asarray(B, dtype=np.float64)))
    return num / den if den else (0.0 if num == 0 else math.inf)
