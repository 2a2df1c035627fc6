"""Narrow number formats of matrix units, and bit-exact rounding into them.

Ape (Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth
Computation with Low-Bitwidth Hardware", ICS '22) splits FP32 data into fp16, bf16 or tf32
slices and INT16 data into int8 bytes (design note `emulated_types.md` sections 2.1-2.2).
Every split step is a round-to-nearest-even into the narrow type, so the error analysis of
section 2.2 holds only if that rounding is exact. This module gives it once, generically:

* ``FloatFormat`` describes a binary floating format by its precision p (significand bits,
  hidden bit included), exponent range [emin, emax], largest finite value and what an
  overflow becomes (``overflow``: "inf" as IEEE 754, "nan", or "saturate" to the largest
  finite value).
* ``round_to(x, fmt)`` rounds float64 or float32 input straight into the format (no double
  rounding through float32), with subnormals and the format's overflow rule, and returns
  float32 arrays that hold the narrow values exactly.
* fp8 comes in both OCP OFP8 conventions (Open Compute Project, "OCP 8-bit Floating Point
  Specification (OFP8)", rev. 1.0, 2023, conversion modes): saturating ("satfinite", what
  torch's float8 casts do for e4m3) and non-saturating (e4m3: NaN, e5m2: inf, what torch's
  e5m2 cast does). The default names follow torch: "fp8_e4m3" saturates, "fp8_e5m2" overflows
  to inf; "fp8_e4m3_nan" and "fp8_e5m2_sat" are the other convention of each.
* ``is_representable``, ``check_int8`` and ``check_int32`` are the guards the DSA model
  (`furnace.emulation.dsa`) uses to refuse values that leaked from a wider type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_FLOAT32_MIN_QUANTUM_EXP = -149


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format with round-to-nearest-even.

    A finite value is ``M * 2**(e - precision + 1)`` with integer ``|M| < 2**precision`` and
    ``e >= emin``; normal values have ``e <= emax`` and subnormals use ``e = emin``.
    ``max_finite`` is given separately because fp8 e4m3 spends its top codes on NaN, so its
    largest value is below the top of the exponent range. ``overflow`` says what a value
    whose rounding exceeds ``max_finite`` becomes: "inf" (IEEE 754; needs ``has_inf``),
    "nan" (OCP OFP8 non-saturating e4m3), or "saturate" (OCP "satfinite": +-max_finite, and
    infinities too, as torch's float8_e4m3fn cast does).
    """

    name: str
    precision: int
    emin: int
    emax: int
    max_finite: float
    has_inf: bool = True
    overflow: str = "inf"

    def __post_init__(self) -> None:
        if not 2 <= self.precision <= 24:
            raise ValueError(f"{self.name}: precision must be in [2, 24] to fit float32")
        if self.emin - self.precision + 1 < _FLOAT32_MIN_QUANTUM_EXP or self.emax > 127:
            raise ValueError(f"{self.name}: exponent range does not fit inside float32")
        if not self.emin < 0 < self.emax:
            raise ValueError(f"{self.name}: need emin < 0 < emax")
        top = (2.0 - 2.0 ** (1 - self.precision)) * 2.0**self.emax
        if not 0 < self.max_finite <= top:
            raise ValueError(f"{self.name}: max_finite must be in (0, {top!r}]")
        if self.overflow not in ("inf", "nan", "saturate"):
            raise ValueError(f"{self.name}: overflow must be 'inf', 'nan' or 'saturate', "
                             f"got {self.overflow!r}")
        if self.overflow == "inf" and not self.has_inf:
            raise ValueError(f"{self.name}: a format without infinities cannot overflow to inf")

    @property
    def unit_roundoff(self) -> float:
        """u = 2**-p, the relative error bound of one rounding (section 2.2's u_t)."""
        return 2.0**-self.precision

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.precision + 1)


def _ieee(name: str, precision: int, exponent_bits: int, overflow: str = "inf") -> FloatFormat:
    emax = 2 ** (exponent_bits - 1) - 1
    return FloatFormat(
        name=name,
        precision=precision,
        emin=1 - emax,
        emax=emax,
        max_finite=(2.0 - 2.0 ** (1 - precision)) * 2.0**emax,
        overflow=overflow,
    )


FP32 = _ieee("fp32", 24, 8)
FP16 = _ieee("fp16", 11, 5)
BF16 = _ieee("bf16", 8, 8)
# NVIDIA TensorFloat-32: fp32's 8 exponent bits and fp16's 10 fraction bits
TF32 = _ieee("tf32", 11, 8)
# OCP fp8 e5m2 is IEEE-like: torch's float8_e5m2 cast overflows to inf from 61440 (the tie
# above 57344) on; the saturating variant is OCP's satfinite mode
FP8_E5M2 = _ieee("fp8_e5m2", 3, 5)
FP8_E5M2_SAT = _ieee("fp8_e5m2_sat", 3, 5, overflow="saturate")
# OCP fp8 e4m3 ("fn"): no infinities, and S.1111.111 is NaN, so the top value is 1.75 * 2**8.
# torch's float8_e4m3fn cast saturates: everything beyond +-448, infinities included, becomes
# +-448; the OCP non-saturating mode gives NaN instead (from 464, the tie above 448, on)
FP8_E4M3 = FloatFormat(
    name="fp8_e4m3", precision=4, emin=-6, emax=8, max_finite=448.0, has_inf=False,
    overflow="saturate",
)
FP8_E4M3_NAN = FloatFormat(
    name="fp8_e4m3_nan", precision=4, emin=-6, emax=8, max_finite=448.0, has_inf=False,
    overflow="nan",
)

FORMATS: dict[str, FloatFormat] = {
    f.name: f for f in (FP32, FP16, BF16, TF32, FP8_E5M2, FP8_E5M2_SAT, FP8_E4M3, FP8_E4M3_NAN)
}


def get_format(fmt: str | FloatFormat) -> FloatFormat:
    """A format by name: "fp16", "bf16", "tf32", "fp32", "fp8_e4m3" (saturating, as torch),
    "fp8_e4m3_nan" (OCP non-saturating), "fp8_e5m2" (inf on overflow, as torch) and
    "fp8_e5m2_sat" (OCP satfinite)."""
    if isinstance(fmt, FloatFormat):
        return fmt
    try:
        return FORMATS[fmt]
    except (KeyError, TypeError):
        raise ValueError(f"unknown float format {fmt!r}; known: {sorted(FORMATS)}") from None


def _as_float64(x) -> np.ndarray:
    """x as float64 without any rounding; refuse inputs that would be rounded on the way."""
    arr = np.asarray(x)
    kind = arr.dtype.kind
    if kind == "f":
        if arr.dtype.itemsize > 8:
            raise TypeError(
                f"{arr.dtype} input would be rounded to float64 first (double rounding); "
                "round it to float64 yourself if that is intended"
            )
        # signalling NaNs raise "invalid" on widening; they stay NaN, which is what we want
        with np.errstate(invalid="ignore"):
            return arr.astype(np.float64)
    if kind in "iub":
        out = arr.astype(np.float64)
        if arr.dtype.itemsize == 8 and arr.size and np.max(np.abs(out)) > 2.0**53:
            raise ValueError("64-bit integers above 2**53 are not exact in float64")
        return out
    raise TypeError(f"expected a real numeric array, got dtype {arr.dtype}")


def round_to(x, fmt: str | FloatFormat) -> np.ndarray:
    """Round x to nearest (ties to even) in ``fmt``; the exact narrow values, as float32.

    Gradual underflow: below 2**emin the quantum stays 2**(emin - p + 1). Overflow: a value
    whose rounding with an unbounded exponent exceeds ``max_finite`` (so for IEEE formats
    max_finite + half an ulp, 65520 for fp16, and above) becomes what ``fmt.overflow`` says:
    +-inf (IEEE 754), NaN, or +-max_finite (saturating; infinite inputs saturate too, as in
    OCP's satfinite mode and torch's float8_e4m3fn cast). Infinite inputs of a non-saturating
    format without infinities become NaN. NaN stays NaN and signed zeros keep their sign.
    """
    fmt = get_format(fmt)
    x64 = _as_float64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        _, e = np.frexp(x64)
        # frexp gives x = m * 2**e with 0.5 <= |m| < 1, so the leading bit is at e - 1;
        # subnormals keep the quantum of the smallest normal binade
        quantum_exp = np.maximum(e - 1, fmt.emin) - (fmt.precision - 1)
        # the scaled value has at most p integer bits plus a fraction: ldexp is exact and
        # np.rint is round-half-to-even, so this is a single correct rounding from float64
        rounded = np.ldexp(np.rint(np.ldexp(x64, -quantum_exp)), quantum_exp)
        # rint(inf) is inf, so infinite inputs land here too
        overflow = np.abs(rounded) > fmt.max_finite
        if np.any(overflow):
            big = {"inf": np.inf, "nan": np.nan, "saturate": fmt.max_finite}[fmt.overflow]
            rounded = np.where(overflow, np.copysign(big, x64), rounded)
    return rounded.astype(np.float32)


def is_representable(x, fmt: str | FloatFormat) -> np.ndarray:
    """Elementwise: is x exactly a value of ``fmt``? NaN counts as representable."""
    x64 = _as_float64(x)
    narrow = round_to(x64, fmt).astype(np.float64)
    return (narrow == x64) | (np.isnan(narrow) & np.isnan(x64))


def _check_int_range(x, lo: int, hi: int, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} values must be integers or integer-valued floats, got {arr.dtype}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} values must be finite")
        if np.any(arr != np.trunc(arr)):
            bad = int(np.count_nonzero(arr != np.trunc(arr)))
            raise ValueError(f"{bad} value(s) are not integers; {name} needs integer values")
    if arr.size and (arr.min() < lo or arr.max() > hi):
        raise ValueError(
            f"{name} values must lie in [{lo}, {hi}]; got [{arr.min()}, {arr.max()}]"
        )
    return arr


def check_int8(x) -> np.ndarray:
    """x as an int8 array, after checking it is integer-valued and inside [-128, 127]."""
    return _check_int_range(x, -128, 127, "int8").astype(np.int8)


def check_int32(x) -> np.ndarray:
    """x as an int32 array, after checking it is integer-valued and inside the int32 range."""
    return _check_int_range(x, -(2**31), 2**31 - 1, "int32").astype(np.int32)
