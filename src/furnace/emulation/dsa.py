"""A domain-specific accelerator that offers only its native operations, and counts them.

Ape (Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth
Computation with Low-Bitwidth Hardware", ICS '22) runs FP32 and INT16 work on Tensor Core
and Ascend matrix units that only multiply fp16/bf16/tf32 or int8 data. On a CPU the
emulation is honest only if nothing wider slips through, so `DSA` is the whole machine an
emulated algorithm may use (design note `emulated_types.md` section 6.1):

* the matrix unit: ``mm(a, b, fmt)`` for the formats its profile lists, inputs exactly
  representable in ``fmt`` and held in float32, FP32 accumulation; ``mm_int8(a, b)`` with
  exact INT32 accumulation;
* an FP32 vector unit: elementwise add, sub, mul, fma, div, sqrt, neg, abs, maximum,
  minimum, compare, and a sum reduction, each IEEE float32 round-to-nearest.

Anything else (float64 data, a value that is not exact in the format, a format the chip
lacks, an int8 product that would overflow INT32) raises `NotNativeError`. Every call adds
to `DSA.counters`; `modelled_seconds` turns the counts into time on a profile from
`furnace.runtime.presets`.

Accumulation: the float32 matmul behind ``mm`` is the host BLAS sgemm, which rounds to
nearest (with FMA) and sums in blocks. That is *more* accurate than a Tensor Core, which
aligns and truncates inside its adders (section 6.9), so errors measured here are a lower
bound on what the hardware would show.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from furnace.emulation.formats import (
    FORMATS,
    FP32,
    FloatFormat,
    _check_int_range,
    is_representable,
)
from furnace.runtime.cost import serial_compute_time
from furnace.runtime.presets import DSAProfile, get_dsa_profile

INT32_MAX = 2**31 - 1
# int8 products are at most 2**14, so 1024 of them sum to at most 2**24: every partial sum
# of a float32 GEMM over a 1024-wide slice of k is an integer float32 holds exactly
_INT8_EXACT_CHUNK = 1024
# narrow values travel in their own width except tf32, which sits in 32-bit containers
_STORAGE_BYTES = {"fp16": 2, "bf16": 2, "tf32": 4, "fp8_e4m3": 1, "fp8_e4m3_nan": 1,
                  "fp8_e5m2": 1, "fp8_e5m2_sat": 1}

_COMPARISONS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


class NotNativeError(TypeError):
    """An operation, format or operand the modelled accelerator does not have."""


class Int32OverflowError(NotNativeError, OverflowError):
    """An int8 matmul whose INT32 accumulator could overflow."""


@dataclass
class OpTally:
    """Calls, operations and bytes moved by one kind of native op."""

    calls: int = 0
    flops: int = 0
    bytes: int = 0


@dataclass
class DSACounters:
    """What a DSA has executed since its last reset.

    ``ops`` is keyed by op name ("mm_bf16", "mm_int8", "add", "fma", ...); ``flops_by_unit``
    by "matrix:<format>" or "vector:fp32", the keys the time model prices. A matmul counts
    2mnk operations; a vector op one per output element (fma two, a sum n - 1 per output).
    """

    ops: dict[str, OpTally] = field(default_factory=dict)
    flops_by_unit: dict[str, int] = field(default_factory=dict)
    bytes_moved: int = 0

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.ops.values())

    @property
    def flops(self) -> int:
        return sum(self.flops_by_unit.values())

    def record(self, op: str, unit: str, flops: int, nbytes: int) -> None:
        tally = self.ops.setdefault(op, OpTally())
        tally.calls += 1
        tally.flops += flops
        tally.bytes += nbytes
        self.flops_by_unit[unit] = self.flops_by_unit.get(unit, 0) + flops
        self.bytes_moved += nbytes


def modelled_seconds(counters: DSACounters, profile: DSAProfile) -> float:
    """Time of the counted work on ``profile``: sum over units of flops/peak + bytes/BW.

    Additive, not a roofline: compute and memory traffic are assumed not to overlap, which
    overstates time for large GEMMs by at most 2x but charges the split and merge passes of
    an emulation (bandwidth-bound vector work) their full cost (section 6.9). The sum is
    `furnace.runtime.cost.serial_compute_time`; this function only looks up the rates.
    """
    work: list[tuple[float, float]] = []
    for unit, flops in counters.flops_by_unit.items():
        if flops == 0:
            continue
        kind, fmt = unit.split(":")
        if kind == "matrix":
            peak = profile.matrix_peak_ops.get(fmt)
        else:
            peak = profile.vector_fp32_flops
        if peak is None:
            raise ValueError(f"profile {profile.name!r} has no peak figure for {unit}")
        work.append((flops, peak))
    if counters.bytes_moved and profile.memory_bandwidth_Bps is None:
        raise ValueError(f"profile {profile.name!r} has no memory bandwidth figure")
    return serial_compute_time(work, counters.bytes_moved, profile.memory_bandwidth_Bps)


def _fp32_operand(x, op: str):
    """x if it is float32 data (or a Python number exact in float32); refuse anything else."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        if not is_representable(x, FP32):
            raise NotNativeError(f"{op}: the scalar {x!r} is not exact in float32")
        return np.float32(x)
    dtype = getattr(x, "dtype", None)
    if dtype != np.float32:
        raise NotNativeError(
            f"{op}: the vector unit takes float32 data, got {dtype or type(x).__name__}"
        )
    return x


def _nbytes(*arrays) -> int:
    return sum(int(np.asarray(a).nbytes) for a in arrays)


def _fma_float32(a, b, c) -> np.ndarray:
    """float32 a*b + c with one rounding, as a hardware FMA gives.

    The host has no float32 FMA, so: a*b is exact in float64 (48 significant bits); the sum
    is taken in float64 and its rounding error recovered exactly (TwoSum); a nonzero error
    makes the float64 result round-to-odd, and rounding a round-to-odd value with 29 more
    bits than float32 to float32 is a correct single rounding.
    """
    product = np.asarray(np.multiply(a, b, dtype=np.float64))
    addend = np.asarray(c, dtype=np.float64)
    total = np.asarray(product + addend)
    virtual = total - product
    error = (product - (total - virtual)) + (addend - virtual)
    even = (total.view(np.int64) & 1) == 0
    nudge = (error != 0) & even & np.isfinite(total)
    toward = np.where(error > 0, np.inf, -np.inf)
    total = np.where(nudge, np.nextafter(total, toward), total)
    return total.astype(np.float32)


class DSA:
    """An accelerator exposing only native ops, with counters; see the module docstring."""

    def __init__(self, profile: str | DSAProfile = "toy", **profile_overrides) -> None:
        if isinstance(profile, DSAProfile):
            if profile_overrides:
                raise ValueError("overrides apply only to a profile given by name")
            self.profile = profile
        else:
            self.profile = get_dsa_profile(profile, **profile_overrides)
        self.counters = DSACounters()

    def __repr__(self) -> str:
        return f"DSA({self.profile.name!r}, matrix formats {sorted(self.matrix_formats)})"

    @property
    def matrix_formats(self) -> frozenset[str]:
        return self.profile.matrix_formats

    def reset(self) -> None:
        self.counters = DSACounters()

    def modelled_seconds(self, profile: str | DSAProfile | None = None) -> float:
        """The counted work timed on ``profile`` (default: this device's own)."""
        if profile is None:
            profile = self.profile
        elif isinstance(profile, str):
            profile = get_dsa_profile(profile)
        return modelled_seconds(self.counters, profile)

    # --- matrix unit ---------------------------------------------------------------------

    def _matrix_format(self, in_format: str | FloatFormat) -> FloatFormat:
        name = in_format.name if isinstance(in_format, FloatFormat) else in_format
        if name not in self.matrix_formats or name == "int8":
            raise NotNativeError(
                f"{self.profile.name} has no {name!r} matrix unit; "
                f"its float formats: {sorted(self.matrix_formats - {'int8'})}"
            )
        fmt = FORMATS.get(name)
        if fmt is None:
            raise NotNativeError(f"no rounding rule for matrix format {name!r}")
        return fmt

    @staticmethod
    def _matmul_shapes(a, b, op: str) -> tuple[int, int, int]:
        if a.ndim != 2 or b.ndim != 2:
            raise ValueError(f"{op} takes 2-D matrices, got shapes {a.shape} and {b.shape}")
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"{op}: inner dimensions differ, {a.shape} @ {b.shape}")
        return a.shape[0], a.shape[1], b.shape[1]

    def mm(self, a: np.ndarray, b: np.ndarray, in_format: str | FloatFormat) -> np.ndarray:
        """a @ b on the matrix unit: ``in_format`` inputs (held in float32), FP32 output.

        Products of p <= 12 bit significands are exact in float32, so only the accumulation
        rounds (host sgemm: round-to-nearest, blocked; see the module docstring).
        """
        fmt = self._matrix_format(in_format)
        op = f"mm_{fmt.name}"
        for label, x in (("a", a), ("b", b)):
            if getattr(x, "dtype", None) != np.float32:
                raise NotNativeError(
                    f"{op}: {label} must be float32 containers of {fmt.name} values, "
                    f"got {getattr(x, 'dtype', type(x).__name__)}"
                )
            exact = is_representable(x, fmt)
            if not exact.all():
                bad = int(exact.size - np.count_nonzero(exact))
                raise NotNativeError(
                    f"{op}: {bad} value(s) of {label} are not exactly {fmt.name} "
                    "(round with furnace.emulation.formats.round_to first)"
                )
        m, k, n = self._matmul_shapes(a, b, op)
        out = np.matmul(a, b)
        nbytes = (m * k + k * n) * _STORAGE_BYTES.get(fmt.name, 4) + out.nbytes
        self.counters.record(op, f"matrix:{fmt.name}", 2 * m * n * k, nbytes)
        return out

    def mm_int8(
        self,
        a: np.ndarray,
        b: np.ndarray,
        *,
        overflow_check: Literal["bound", "result"] = "bound",
    ) -> np.ndarray:
        """a @ b for int8-valued a, b with exact INT32 accumulation; returns int32.

        ``overflow_check="bound"`` refuses any call with k * max|a| * max|b| > 2**31 - 1,
        the guard Ozaki-style splits are designed against. ``"result"`` refuses only if the
        exact result leaves int32: wrapping two's-complement accumulation is exact modulo
        2**32, so a final value inside int32 is correct even if a partial sum wrapped.
        """
        if "int8" not in self.matrix_formats:
            raise NotNativeError(f"{self.profile.name} has no int8 matrix unit")
        if overflow_check not in ("bound", "result"):
            raise ValueError(f"overflow_check must be 'bound' or 'result', not {overflow_check!r}")
        try:
            a8 = _check_int_range(a, -128, 127, "int8").astype(np.int8)
            b8 = _check_int_range(b, -128, 127, "int8").astype(np.int8)
        except (TypeError, ValueError) as err:
            raise NotNativeError(f"mm_int8: {err}") from None
        m, k, n = self._matmul_shapes(a8, b8, "mm_int8")
        max_a = int(np.abs(a8.astype(np.int16)).max(initial=0))
        max_b = int(np.abs(b8.astype(np.int16)).max(initial=0))
        bound = k * max_a * max_b
        if overflow_check == "bound" and bound > INT32_MAX:
            raise Int32OverflowError(
                f"mm_int8: k * max|a| * max|b| = {k} * {max_a} * {max_b} = {bound} "
                f"exceeds 2**31 - 1; split k or scale the slices"
            )
        acc = np.zeros((m, n), dtype=np.int64)
        for start in range(0, k, _INT8_EXACT_CHUNK):
            stop = min(start + _INT8_EXACT_CHUNK, k)
            part = np.matmul(
                a8[:, start:stop].astype(np.float32), b8[start:stop].astype(np.float32)
            )
            acc += part.astype(np.int64)
        if bound > INT32_MAX and np.abs(acc).max(initial=0) > INT32_MAX:
            raise Int32OverflowError("mm_int8: the exact result does not fit in int32")
        out = acc.astype(np.int32)
        self.counters.record("mm_int8", "matrix:int8", 2 * m * n * k, m * k + k * n + out.nbytes)
        return out

    # --- FP32 vector unit ----------------------------------------------------------------

    def _vector(self, op: str, fn, *operands, flops_per_element: int = 1) -> np.ndarray:
        args = [_fp32_operand(x, op) for x in operands]
        with np.errstate(all="ignore"):
            out = fn(*args)
        out = np.asarray(out)
        if out.dtype not in (np.float32, np.bool_):
            raise AssertionError(f"{op} produced {out.dtype}; the vector unit is float32 only")
        nbytes = _nbytes(*(x for x in args if isinstance(x, np.ndarray)), out)
        self.counters.record(op, "vector:fp32", flops_per_element * out.size, nbytes)
        return out

    def add(self, a, b) -> np.ndarray:
        return self._vector("add", np.add, a, b)

    def sub(self, a, b) -> np.ndarray:
        return self._vector("sub", np.subtract, a, b)

    def mul(self, a, b) -> np.ndarray:
        return self._vector("mul", np.multiply, a, b)

    def div(self, a, b) -> np.ndarray:
        return self._vector("div", np.divide, a, b)

    def fma(self, a, b, c) -> np.ndarray:
        """a * b + c rounded once, as a fused multiply-add."""
        return self._vector("fma", _fma_float32, a, b, c, flops_per_element=2)

    def sqrt(self, a) -> np.ndarray:
        return self._vector("sqrt", np.sqrt, a)

    def neg(self, a) -> np.ndarray:
        return self._vector("neg", np.negative, a)

    def abs(self, a) -> np.ndarray:
        return self._vector("abs", np.abs, a)

    def maximum(self, a, b) -> np.ndarray:
        return self._vector("maximum", np.maximum, a, b)

    def minimum(self, a, b) -> np.ndarray:
        return self._vector("minimum", np.minimum, a, b)

    def compare(self, a, b, relation: str) -> np.ndarray:
        """Elementwise a <relation> b for relation in <, <=, >, >=, ==, != (bool result)."""
        try:
            fn = _COMPARISONS[relation]
        except KeyError:
            raise ValueError(f"relation must be one of {sorted(_COMPARISONS)}") from None
        return self._vector(f"compare{relation}", fn, a, b)

    def sum(self, a, axis: int | None = None) -> np.ndarray:
        """Float32 sum (numpy's pairwise float32 summation: every addition is IEEE fp32)."""
        a = _fp32_operand(a, "sum")
        if not isinstance(a, np.ndarray):
            raise NotNativeError("sum takes a float32 array")
        out = np.asarray(np.sum(a, axis=axis, dtype=np.float32))
        flops = a.size - out.size if a.size else 0
        self.counters.record("sum", "vector:fp32", flops, a.nbytes + out.nbytes)
        return out
