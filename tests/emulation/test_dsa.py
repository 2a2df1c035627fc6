"""Tests of the native-ops-only DSA model (Ape, ICS '22; design note sections 6.1 and 6.9)."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.emulation.dsa import (
    DSA,
    DSACounters,
    Int32OverflowError,
    NotNativeError,
    modelled_seconds,
)
from furnace.emulation.formats import round_to
from furnace.runtime.presets import get_dsa_profile


def _narrow(shape, fmt, seed=0):
    return round_to(np.random.default_rng(seed).standard_normal(shape), fmt)


def test_mm_refuses_float64_input():
    dsa = DSA("a100")
    a = _narrow((4, 3), "bf16")
    with pytest.raises(NotNativeError, match="float32 containers"):
        dsa.mm(a.astype(np.float64), a.T.copy(), "bf16")


def test_mm_refuses_a_value_that_is_not_bf16():
    dsa = DSA("a100")
    a = _narrow((4, 3), "bf16")
    a[1, 2] = np.float32(1 + 2.0**-10)
    with pytest.raises(NotNativeError, match="1 value.*not exactly bf16"):
        dsa.mm(a, _narrow((3, 2), "bf16"), "bf16")
    assert dsa.counters.calls == 0


def test_mm_refuses_a_format_the_chip_lacks():
    dsa = DSA("ascend910")
    a = _narrow((2, 2), "bf16")
    with pytest.raises(NotNativeError, match="no 'bf16' matrix unit"):
        dsa.mm(a, a, "bf16")
    with pytest.raises(NotNativeError):
        DSA("toy").mm(a, a, "tf32")
    with pytest.raises(NotNativeError):
        dsa.mm(a, a, "fp64")
    assert dsa.mm(round_to(a, "fp16"), round_to(a, "fp16"), "fp16").shape == (2, 2)


def test_mm_int8_refuses_possible_overflow():
    dsa = DSA("h100")
    k = 2**31 // (127 * 127) + 1
    a = np.full((1, k), 127, dtype=np.int8)
    with pytest.raises(Int32OverflowError, match="exceeds 2\\*\\*31 - 1"):
        dsa.mm_int8(a, a.T.copy())
    assert isinstance(Int32OverflowError("x"), OverflowError)
    # alternating signs keep the true result small: only the exact-range check accepts it
    b = np.where(np.arange(k) % 2 == 0, 127, -127).astype(np.int8).reshape(k, 1)
    assert dsa.mm_int8(a, b, overflow_check="result")[0, 0] == 127 * 127 * (k % 2)
    with pytest.raises(Int32OverflowError, match="does not fit"):
        dsa.mm_int8(a, a.T.copy(), overflow_check="result")


def test_mm_int8_refuses_non_int8_values_and_is_exact():
    dsa = DSA("toy")
    with pytest.raises(NotNativeError, match="int8"):
        dsa.mm_int8(np.array([[128]]), np.array([[1]]))
    with pytest.raises(NotNativeError, match="not integers"):
        dsa.mm_int8(np.array([[0.5]]), np.array([[1]]))
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=(7, 3000)).astype(np.int8)
    b = rng.integers(-128, 128, size=(3000, 5)).astype(np.int8)
    out = dsa.mm_int8(a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64))


def test_vector_ops_refuse_float64():
    dsa = DSA("toy")
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(NotNativeError, match="float32"):
        dsa.add(x, np.ones(3))
    with pytest.raises(NotNativeError, match="float32"):
        dsa.sqrt(np.ones(3))
    with pytest.raises(NotNativeError, match="not exact in float32"):
        dsa.mul(x, 0.1)
    assert dsa.mul(x, 0.5).dtype == np.float32


def test_counters_count_2mnk_and_elements():
    dsa = DSA("toy")
    m, k, n = 5, 7, 3
    dsa.mm(_narrow((m, k), "fp16"), _narrow((k, n), "fp16", 1), "fp16")
    dsa.mm(_narrow((m, k), "fp16"), _narrow((k, n), "fp16", 1), "fp16")
    dsa.mm_int8(np.ones((m, k), np.int8), np.ones((k, n), np.int8))
    x = np.ones((4, 6), dtype=np.float32)
    dsa.add(x, x)
    dsa.fma(x, x, x)
    dsa.sum(x, axis=1)
    c = dsa.counters
    assert c.ops["mm_fp16"].calls == 2 and c.ops["mm_fp16"].flops == 2 * 2 * m * n * k
    assert c.flops_by_unit["matrix:fp16"] == 4 * m * n * k
    assert c.flops_by_unit["matrix:int8"] == 2 * m * n * k
    assert c.ops["add"].flops == 24 and c.ops["fma"].flops == 48 and c.ops["sum"].flops == 20
    assert c.flops_by_unit["vector:fp32"] == 24 + 48 + 20
    assert c.ops["mm_fp16"].bytes == 2 * ((m * k + k * n) * 2 + m * n * 4)
    assert c.ops["add"].bytes == 3 * x.nbytes
    assert c.calls == 6
    dsa.reset()
    assert dsa.counters.calls == 0 and dsa.counters.bytes_moved == 0


def test_modelled_time_equals_hand_computation():
    dsa = DSA("a100")
    m = k = n = 64
    dsa.mm(_narrow((m, k), "bf16"), _narrow((k, n), "bf16", 1), "bf16")
    x = np.ones(1000, dtype=np.float32)
    dsa.add(x, x)
    flops_mm = 2 * m * n * k
    bytes_total = (m * k + k * n) * 2 + m * n * 4 + 3 * 4000
    expected = flops_mm / 312e12 + 1000 / 19.5e12 + bytes_total / 2.0e12
    assert dsa.modelled_seconds() == pytest.approx(expected, rel=1e-12)
    on_h100 = flops_mm / 989e12 + 1000 / 67e12 + bytes_total / 3.35e12
    assert dsa.modelled_seconds("h100") == pytest.approx(on_h100, rel=1e-12)
    assert modelled_seconds(dsa.counters, get_dsa_profile("h200")) < on_h100


def test_modelled_time_refuses_missing_figures():
    dsa = DSA("ascend910")
    dsa.add(np.ones(4, np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="no peak figure for vector:fp32"):
        dsa.modelled_seconds()
    supplied = DSA("ascend910", vector_fp32_flops=1e12, memory_bandwidth_Bps=1e12)
    supplied.add(np.ones(4, np.float32), np.ones(4, np.float32))
    assert supplied.modelled_seconds() == pytest.approx(4 / 1e12 + 48 / 1e12)
    assert "assumed" in supplied.profile.source


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "tf32"])
def test_mm_matches_float64_within_fp32_accumulation(fmt):
    m, k, n = 16, 300, 12
    a, b = _narrow((m, k), fmt, 2), _narrow((k, n), fmt, 3)
    out = DSA("h100").mm(a, b, fmt)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # products are exact; each of k float32 additions errs by at most 2**-24 of |a||b|
    bound = k * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(out - exact) <= bound)


def test_vector_ops_are_ieee_float32():
    dsa = DSA("toy")
    rng = np.random.default_rng(6)
    a, b, c = (rng.standard_normal(10_000).astype(np.float32) for _ in range(3))
    np.testing.assert_array_equal(dsa.div(a, b), a / b)
    np.testing.assert_array_equal(dsa.sqrt(np.abs(a)), np.sqrt(np.abs(a)))
    np.testing.assert_array_equal(dsa.maximum(a, b), np.maximum(a, b))
    np.testing.assert_array_equal(dsa.compare(a, b, "<="), a <= b)
    # fma rounds once: compare with the exact value rounded once (float64 is exact here
    # only when the sum needs <= 53 bits, so check the rounding error bound instead)
    exact = a.astype(np.float64) * b + c
    fused = dsa.fma(a, b, c).astype(np.float64)
    ulp_half = np.spacing(np.abs(fused).astype(np.float32)).astype(np.float64) / 2
    assert np.all(np.abs(fused - exact) <= ulp_half)
    x = np.float32(1 + 2.0**-23)
    assert dsa.fma(x, x, np.float32(-1)) == np.float32(2.0**-22 + 2.0**-46)
    with pytest.raises(ValueError, match="relation"):
        dsa.compare(a, b, "<>")


def test_fma_rounds_once_where_mul_then_add_rounds_twice():
    dsa = DSA("toy")
    # a*b + c = 1 - 2**-47 exactly, which rounds once to 1; rounding a*b = 1 + 2**-24 - 2**-47
    # first gives 1, and 1 + c = 1 - 2**-24 is then off by almost an ulp
    a = np.float32(1 + 2.0**-24 * 2)  # 1 + 2**-23
    b = np.float32(1 - 2.0**-24)
    c = np.float32(-(2.0**-24))
    separate = dsa.add(dsa.mul(a, b), c)
    fused = dsa.fma(a, b, c)
    exact = float(a) * float(b) + float(c)
    assert abs(float(fused) - exact) <= abs(float(separate) - exact)
    assert float(fused) == float(np.float32(exact))


def test_this_cpu_profile_is_measured_quickly():
    profile = get_dsa_profile("this-cpu")
    assert profile.label == "measured"
    assert profile.native_gemm_flops["fp32"] > 0 and profile.vector_fp32_flops > 0
    dsa = DSA(profile)
    dsa.mm(_narrow((8, 8), "tf32"), _narrow((8, 8), "tf32"), "tf32")
    assert dsa.modelled_seconds() > 0


def test_vendor_profiles_are_labelled_with_sources():
    for name in ("a100", "h100", "h200", "ascend910"):
        profile = get_dsa_profile(name)
        assert profile.label == "datasheet peak" and profile.source
    assert get_dsa_profile("toy").label == "invented"
    assert "bf16" not in get_dsa_profile("ascend910").matrix_formats
    with pytest.raises(ValueError, match="unknown DSA profile"):
        get_dsa_profile("tpu")


def _pin_counters(with_bf16: bool = True) -> DSACounters:
    """Fixed counts on three matrix formats and the vector unit, with memory traffic."""
    counters = DSACounters()
    if with_bf16:
        counters.record("mm_bf16", "matrix:bf16", 2 * 64 * 48 * 32, 12345)
    counters.record("mm_fp16", "matrix:fp16", 2 * 128**3, 98304 + 65536)
    counters.record("mm_int8", "matrix:int8", 2 * 256**3, 3 * 65536)
    counters.record("add", "vector:fp32", 4096, 3 * 16384)
    if with_bf16:
        counters.record("fma", "vector:fp32", 2 * 1000, 4 * 4000)
    return counters


# modelled_seconds of `_pin_counters` computed with the code before issue 12 moved the time
# model onto furnace.runtime.cost; the sum is taken in the same order, so the values agree
# to the last bit (1e-12 relative allows for nothing else)
DSA_PINS = {
    "a100": 2.871316794871795e-07,
    "h100": 1.5221583114643451e-07,
    "h200": 1.1272452206683253e-07,
    "toy": 4.3985362500000003e-07,
}


@pytest.mark.parametrize(("profile", "expected"), list(DSA_PINS.items()))
def test_modelled_time_is_pinned(profile, expected):
    got = modelled_seconds(_pin_counters(), get_dsa_profile(profile))
    assert abs(got - expected) <= 1e-12 * expected


def test_modelled_time_is_pinned_on_ascend():
    # matrix work only: no vector or bandwidth figure is needed
    matrix_only = DSACounters()
    matrix_only.record("mm_fp16", "matrix:fp16", 2 * 512**3, 0)
    matrix_only.record("mm_int8", "matrix:int8", 0, 0)
    got = modelled_seconds(matrix_only, get_dsa_profile("ascend910"))
    assert abs(got - 1.048576e-06) <= 1e-12 * 1.048576e-06
    assumed = get_dsa_profile("ascend910", vector_fp32_flops=1e13, memory_bandwidth_Bps=1.2e12)
    got = modelled_seconds(_pin_counters(with_bf16=False), assumed)
    assert abs(got - 4.236629333333333e-07) <= 1e-12 * 4.236629333333333e-07
