"""Tests of the narrow-format rounding behind Ape's splits (ICS '22, design note section 2.2).

Each format is checked against an independent rounding: numpy's float64 -> float16 cast,
torch's float32 -> bfloat16 and float8 casts, and for tf32 the fp16 cast after a power-of-two
shift (both keep 11 significant bits) and the float32 bit trick of section 6.3.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from furnace.emulation.formats import (
    BF16,
    FP16,
    FP32,
    TF32,
    FloatFormat,
    check_int8,
    check_int32,
    get_format,
    is_representable,
    round_to,
)

float64s = st.floats(allow_nan=True, allow_infinity=True, width=64)
float32s = st.floats(allow_nan=True, allow_infinity=True, width=32)


def _same_bits_fp16(ours: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_array_equal(
        ours.astype(np.float16).view(np.uint16), reference.astype(np.float16).view(np.uint16)
    )


def _all_fp16_values() -> np.ndarray:
    values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return values[np.isfinite(values)].astype(np.float64)


def _fp16_adversarial() -> np.ndarray:
    grid = np.unique(_all_fp16_values())
    mid = (grid[:-1] + grid[1:]) / 2  # exact in float64: ties between neighbours
    nudges = [mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)]
    specials = np.array(
        [0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 1e300, -1e300, 2.0**-25,
         -(2.0**-25), 2.0**-26, 3 * 2.0**-26, 2.0**-24, 2.0**-14, 5e-324, np.inf, -np.inf]
    )
    return np.concatenate(nudges + [specials])


def test_fp16_matches_numpy_on_every_tie_and_its_neighbours():
    x = _fp16_adversarial()
    with np.errstate(over="ignore"):
        _same_bits_fp16(round_to(x, FP16), x.astype(np.float16))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 64), elements=float64s))
def test_fp16_matches_numpy_on_random_float64(x):
    ours = round_to(x, "fp16")
    with np.errstate(over="ignore"):
        reference = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.all(np.isnan(ours[nan]))
    _same_bits_fp16(ours[~nan], reference[~nan])


@settings(max_examples=200, deadline=None)
@given(st.floats(-70000, 70000), st.integers(-30, 0))
def test_fp16_matches_numpy_on_scaled_values(mantissa, shift):
    x = np.array([np.ldexp(mantissa, shift)])
    with np.errstate(over="ignore"):
        _same_bits_fp16(round_to(x, FP16), x.astype(np.float16))


def test_fp16_overflow_threshold_and_signed_zero():
    out = round_to(np.array([65519.999, 65520.0, -65520.0, -1e-30, np.nan]), FP16)
    assert out[0] == 65504 and out[1] == np.inf and out[2] == -np.inf
    assert out[3] == 0 and np.signbit(out[3]) and np.isnan(out[4])


def test_rounds_from_float64_without_double_rounding():
    # float32 would first round this to the tie 1 + 2**-11, which then rounds down to 1
    x = 1.0 + 2.0**-11 + 2.0**-40
    assert round_to(np.float64(x), FP16) == 1.0 + 2.0**-10
    assert round_to(np.float32(x), FP16) == 1.0


def test_bf16_matches_torch_on_random_float32_bit_patterns():
    bits = np.random.default_rng(1).integers(0, 2**32, size=2**18, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    ours = round_to(x, BF16)
    reference = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    nan = np.isnan(x)
    assert np.all(np.isnan(ours[nan]))
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), reference[~nan].view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=float32s))
def test_bf16_matches_torch_on_float32(x):
    ours = round_to(x, "bf16")
    reference = torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    nan = np.isnan(x)
    assert np.all(np.isnan(ours[nan]))
    np.testing.assert_array_equal(ours[~nan], reference[~nan])
    assert np.array_equal(np.signbit(ours[~nan]), np.signbit(reference[~nan]))


def _tf32_by_fp16(x: np.ndarray) -> np.ndarray:
    """RNE to 11 significant bits: shift into fp16's normal binade [1, 2), cast, shift back."""
    _, e = np.frexp(x)
    return np.ldexp(np.ldexp(x, 1 - e).astype(np.float16).astype(np.float64), e - 1)


normal_tf32_range = st.floats(2.0**-125, 2.0**127, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(np.float64, st.integers(1, 64), elements=normal_tf32_range), st.booleans())
def test_tf32_is_rne_to_11_significant_bits(x, negate):
    x = -x if negate else x
    expected = _tf32_by_fp16(x)
    ok = np.abs(expected) <= TF32.max_finite
    np.testing.assert_array_equal(round_to(x, TF32)[ok], expected[ok])


def test_tf32_matches_the_float32_bit_trick():
    x = np.random.default_rng(2).standard_normal(2**16).astype(np.float32) * np.float32(1e3)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    np.testing.assert_array_equal(round_to(x, TF32), rounded.astype(np.uint32).view(np.float32))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, st.integers(2, 64), elements=float64s.filter(lambda v: v == v)))
def test_tf32_is_idempotent_and_monotone(x):
    once = round_to(x, TF32)
    np.testing.assert_array_equal(round_to(once, TF32), once)
    ordered = round_to(np.sort(x), TF32)
    assert np.all(ordered[1:] >= ordered[:-1])


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=["fp16", "bf16"])
def test_every_value_of_a_16_bit_format_rounds_to_itself(fmt):
    if fmt is FP16:
        values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
        values = values.astype(np.float32)
    else:
        values = (np.arange(2**16, dtype=np.uint32) << 16).view(np.float32)
    values = values[~np.isnan(values)]
    np.testing.assert_array_equal(round_to(values, fmt).view(np.uint32), values.view(np.uint32))
    assert is_representable(values, fmt).all()


@settings(max_examples=200, deadline=None)
@given(float64s)
def test_round_to_is_representable_and_fixed(v):
    for fmt in (FP16, BF16, TF32):
        narrow = round_to(np.float64(v), fmt)
        assert is_representable(narrow, fmt)
        np.testing.assert_array_equal(round_to(narrow, fmt), narrow)


@pytest.mark.parametrize(
    "name,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]
)
def test_fp8_matches_torch_inside_the_range(name, dtype):
    fmt = get_format(name)
    x = np.random.default_rng(3).standard_normal(2**14) * np.exp2(
        np.random.default_rng(4).integers(-20, 16, 2**14)
    )
    x = x[np.abs(x) <= fmt.max_finite].astype(np.float32)
    reference = torch.from_numpy(x).to(dtype).to(torch.float32).numpy()
    np.testing.assert_array_equal(round_to(x, fmt), reference)


def _fp8_all_values(dtype) -> np.ndarray:
    """Every finite value of a torch float8 dtype, as float32."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(dtype).to(torch.float32).numpy()
    return values[np.isfinite(values)]


def _fp8_probes(dtype) -> np.ndarray:
    """All values, the ties between neighbours and their float32 neighbours, and the
    boundaries: the overflow tie and beyond, infinities, tiny subnormal ties."""
    grid = np.unique(_fp8_all_values(dtype).astype(np.float64))
    mid = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
    top = float(grid[-1])
    ulp = top - float(grid[-2])
    edges = np.array([top, top + ulp / 2, top + ulp, 2 * top, 1e4, 6e4, 1e30, 3.4e38,
                      np.inf, grid[1] / 2, grid[1] / 4, 0.0, -0.0], dtype=np.float32)
    probes = np.concatenate([grid.astype(np.float32), mid, np.nextafter(mid, np.float32(np.inf)),
                             np.nextafter(mid, np.float32(-np.inf)), edges])
    probes = np.concatenate([probes, np.nextafter(edges, np.float32(0)),
                             np.nextafter(edges, np.float32(np.inf))])
    return np.concatenate([probes, -probes])


def _same_bits_as_torch(x32: np.ndarray, fmt: str, dtype) -> None:
    ours = round_to(x32, fmt)
    reference = torch.from_numpy(x32.copy()).to(dtype).to(torch.float32).numpy()
    nan = np.isnan(reference)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours[~nan].view(np.uint32), reference[~nan].view(np.uint32))


@pytest.mark.parametrize(
    "name,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]
)
def test_fp8_matches_torch_bit_for_bit_on_every_value_tie_and_boundary(name, dtype):
    x = _fp8_probes(dtype)
    # every representable value rounds to itself
    values = _fp8_all_values(dtype)
    np.testing.assert_array_equal(round_to(values, name).view(np.uint32), values.view(np.uint32))
    assert is_representable(values, name).all()
    _same_bits_as_torch(x, name, dtype)


@pytest.mark.parametrize(
    "name,dtype", [("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)]
)
def test_fp8_matches_torch_on_random_float32_bit_patterns(name, dtype):
    bits = np.random.default_rng(5).integers(0, 2**32, size=2**17, dtype=np.uint64)
    _same_bits_as_torch(bits.astype(np.uint32).view(np.float32), name, dtype)


def test_fp8_e4m3_saturates_as_torch_and_the_nan_convention_is_offered_by_name():
    x = np.array([448.0, 460.0, 464.0, 464.1, 480.0, 1e4, np.inf, -1e4, -np.inf, np.nan])
    sat = round_to(x, "fp8_e4m3")
    np.testing.assert_array_equal(sat[:9], [448, 448, 448, 448, 448, 448, 448, -448, -448])
    assert np.isnan(sat[9])
    # OCP non-saturating e4m3: no inf, so everything past the tie at 464 (and inf) is NaN
    nan = round_to(x, "fp8_e4m3_nan")
    np.testing.assert_array_equal(nan[:3], [448, 448, 448])  # 464 is a tie, to even 448
    assert np.all(np.isnan(nan[3:]))
    assert get_format("fp8_e4m3").overflow == "saturate"
    assert get_format("fp8_e4m3_nan").overflow == "nan"


def test_fp8_e5m2_overflows_to_inf_as_torch_and_saturates_by_name():
    x = np.array([57344.0, 61439.0, 61440.0, 1e6, np.inf, -1e6])
    ieee = round_to(x, "fp8_e5m2")
    np.testing.assert_array_equal(ieee, [57344, 57344, np.inf, np.inf, np.inf, -np.inf])
    sat = round_to(x, "fp8_e5m2_sat")
    np.testing.assert_array_equal(sat, [57344, 57344, 57344, 57344, 57344, -57344])
    with pytest.raises(ValueError, match="overflow"):
        FloatFormat("bad", precision=4, emin=-6, emax=8, max_finite=448.0, has_inf=False)


def test_representability_examples():
    assert is_representable(np.float32(1 + 2.0**-10), FP16)
    assert not is_representable(np.float32(1 + 2.0**-11), FP16)
    assert not is_representable(np.float32(1 + 2.0**-8), BF16)
    assert not is_representable(np.float64(1 + 2.0**-30), FP32)
    assert not is_representable(np.float64(np.inf), "fp8_e4m3")
    assert is_representable(np.float64(np.nan), BF16)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="unknown float format"):
        get_format("fp12")
    with pytest.raises(TypeError, match="double rounding"):
        round_to(np.ones(2, dtype=np.longdouble), FP16)
    with pytest.raises(TypeError):
        round_to(np.ones(2, dtype=complex), FP16)
    with pytest.raises(ValueError, match="fit"):
        FloatFormat("too-wide", precision=30, emin=-10, emax=10, max_finite=1.0)


def test_int_checks():
    np.testing.assert_array_equal(check_int8([-128.0, 0, 127]), np.array([-128, 0, 127]))
    assert check_int8(np.array([1, 2])).dtype == np.int8
    with pytest.raises(ValueError, match="lie in"):
        check_int8([128])
    with pytest.raises(ValueError, match="not integers"):
        check_int8([0.5])
    with pytest.raises(ValueError, match="finite"):
        check_int8([np.nan])
    with pytest.raises(ValueError, match="lie in"):
        check_int32(np.array([2**31], dtype=np.int64))
    assert check_int32([2**31 - 1]).dtype == np.int32
