"""Tests of the emulated GEMM types (Ape, Ma et al. ICS '22; Ozaki et al.; Joldes-Muller-
Popescu), design note `emulated_types.md` sections 2, 4.1-4.3, 6.2-6.4 and 6.8."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.emulation import naive
from furnace.emulation.dsa import DSA, NotNativeError
from furnace.emulation.types import TYPES, RangeError, bound_metric, get_type, ozaki1, ozaki2

FP32_FAMILY = ["BF16", "TF32", "FP16", "BF16x2", "FP32-F", "FP32-T", "FP32-B", "FP32-B9"]


def _uniform(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _wide(shape, seed):
    """Signed values with exponents uniform over 2^-30..2^30."""
    rng = np.random.default_rng(seed)
    mant = rng.uniform(0.5, 1, shape) * rng.choice([-1.0, 1.0], shape)
    return np.ldexp(mant, rng.integers(-30, 31, shape)).astype(np.float32)


def _exact_gemm(A, B):
    """A @ B with every entry the correctly rounded float64 of its exact value (Python-int
    sums, `naive.exact_gemm_entries`): an fp64-class reference on every platform."""
    rows, cols = naive.sample_entries(A.shape[0], B.shape[1], A.shape[0] * B.shape[1])
    exact = naive.exact_gemm_entries(A, B, rows, cols)
    return np.array([float(x) for x in exact]).reshape(A.shape[0], B.shape[1])


def _dot2_gemm(A, B):
    """float64 A @ B as accurate as if accumulated in twice float64's precision, then rounded
    (Ogita, Rump, Oishi, "Accurate sum and dot product", SISC 2005, Dot2): error-free
    transformations in float64 alone, so the same on every platform, unlike np.longdouble
    (extended precision only on x86-64). Error at most 2^-53 |AB| + gamma_k^2 |A||B|, gamma_k
    about k 2^-53 (their Dot2 error bound).

    For matrices too large for `_exact_gemm` (512^3 is 134M Python-int products).
    """
    split = 2.0**27 + 1  # Veltkamp: x = hi + lo with 26-bit halves, so hi * hi' is exact

    def halves(X):
        c = split * X
        hi = c - (c - X)
        return hi, X - hi

    (Ah, Al), (Bh, Bl) = halves(A), halves(B)
    s = np.zeros((A.shape[0], B.shape[1]))
    c = np.zeros_like(s)
    for k in range(A.shape[1]):
        a, ah, al = A[:, k, None], Ah[:, k, None], Al[:, k, None]
        b, bh, bl = B[None, k], Bh[None, k], Bl[None, k]
        p = a * b
        product_error = ((ah * bh - p) + ah * bl + al * bh) + al * bl  # Dekker: exact
        t = s + p
        z = t - s
        c += (s - (t - z)) + (p - z) + product_error  # Knuth's TwoSum error of s + p
        s = t
    return s + c


def _nerr(C, ref, A, B):
    """Normwise error with a floor tied to the inputs (no division by a vanishing ref)."""
    return naive.normwise_error(C, ref, scale=naive.gemm_floor(A, B))


def _error(name, A, B, dsa=None):
    C = get_type(name).gemm(A, B, dsa or DSA("a100"))
    return _nerr(C, naive.gemm_reference(A, B), A, B)


def test_registry_names_families_and_cost_order():
    expected = set(FP32_FAMILY) | {"INT16", "DF32"}
    expected |= {f"OZ1-S{s}" for s in (6, 7, 8)} | {f"OZ2-N{n}" for n in (8, 12, 14, 16)}
    assert set(TYPES) == expected
    for name, t in TYPES.items():
        assert t.name == name
        assert t.family in ("fp32", "fp64", "int16", "narrow")
    assert list(TYPES)[0] in ("BF16", "FP16")
    assert list(TYPES)[-1] == "DF32"
    assert TYPES["FP32-B"].native_gemms == 6 and TYPES["FP32-B9"].native_gemms == 9
    assert TYPES["OZ1-S8"].native_gemms == 36 and TYPES["OZ2-N14"].native_gemms == 14


def test_get_type_builds_unregistered_ozaki_sizes_and_refuses_unknown_names():
    assert get_type("OZ1-S5").native_gemms == 15
    assert get_type("OZ2-N10").native_gemms == 10
    assert ozaki1(4).name == "OZ1-S4" and ozaki2(9).name == "OZ2-N9"
    with pytest.raises(ValueError, match="unknown emulated type"):
        get_type("FP32-X")
    with pytest.raises(ValueError, match="s must be"):
        ozaki1(0)


def test_fp32_ladder_on_uniform_data():
    A, B = _uniform((256, 256), 0), _uniform((256, 256), 1)
    ref = naive.gemm_reference(A, B)
    native = _nerr(A @ B, ref, A, B)
    err = {name: _error(name, A, B) for name in FP32_FAMILY}
    assert 1e-3 <= err["BF16"] <= 1e-2
    assert 1e-5 <= err["TF32"] <= 1e-3 and 1e-5 <= err["FP16"] <= 1e-3
    assert err["BF16x2"] < 1e-5
    assert err["FP32-F"] <= 4 * native
    assert err["FP32-T"] <= 4 * native
    assert err["FP32-B"] <= native
    assert err["FP32-B9"] <= native


@pytest.mark.parametrize("dist", ["uniform", "normal", "uniform01", "wide"])
def test_fp32_b_at_least_as_accurate_as_native_fp32(dist):
    rng = np.random.default_rng(7)
    make = {
        "uniform": lambda s: rng.uniform(-1, 1, s),
        "normal": lambda s: rng.standard_normal(s),
        "uniform01": lambda s: rng.uniform(0, 1, s),
        "wide": lambda s: _wide(s, int(rng.integers(1 << 30))),
    }[dist]
    A = make((256, 256)).astype(np.float32)
    B = make((256, 256)).astype(np.float32)
    native = _nerr(A @ B, naive.gemm_reference(A, B), A, B)
    assert _error("FP32-B", A, B) <= native


def test_wide_range_data_needs_a_full_range_type():
    A, B = _wide((128, 128), 3), _wide((128, 128), 4)
    assert not TYPES["FP32-F"].fits_range(A, B)
    assert not TYPES["FP16"].fits_range(A, B)
    native = _nerr(A @ B, naive.gemm_reference(A, B), A, B)
    assert _error("FP32-T", A, B) <= 4 * native
    assert _error("FP32-B", A, B) <= 2 * native


def test_int16_is_exact_at_the_range_ends():
    rng = np.random.default_rng(5)
    A = rng.integers(-32896, 32640, (48, 70))
    B = rng.integers(-32896, 32640, (70, 33))
    A[0, :] = 32639
    B[:, 0] = 32639
    A[1, :] = -32896
    C = TYPES["INT16"].gemm(A, B, DSA("a100"))
    assert C.dtype == np.int64
    assert np.array_equal(C.astype(object), naive.exact_int_gemm(A, B))


def test_int16_refuses_values_two_bytes_cannot_hold():
    A = np.full((2, 2), 32640)
    assert not TYPES["INT16"].fits_range(A)
    with pytest.raises(RangeError, match="integers in"):
        TYPES["INT16"].gemm(A, A, DSA("a100"))


@pytest.fixture(scope="module")
def fp64_case():
    rng = np.random.default_rng(11)
    A = rng.standard_normal((512, 512))
    B = rng.standard_normal((512, 512))
    rows, cols = naive.sample_entries(512, 512, 200, rng=2)
    exact = np.array([float(x) for x in naive.exact_gemm_entries(A, B, rows, cols)])
    reference = _dot2_gemm(A, B)
    # the full reference is the exact product, rounded, where it can be checked
    assert naive.normwise_error(reference[rows, cols], exact) <= 2.0**-53
    return A, B, reference, rows, cols, exact


@pytest.mark.parametrize("name", ["OZ2-N15", "OZ2-N16", "OZ1-S8"])
def test_ozaki_reaches_fp64_accuracy(fp64_case, name):
    A, B, reference, rows, cols, exact = fp64_case
    C = get_type(name).gemm(A, B, DSA("a100"))
    assert C.dtype == np.float64
    floor = naive.gemm_floor(A, B)
    assert naive.normwise_error(C[rows, cols], exact, scale=floor) <= 1e-15
    assert naive.normwise_error(C, reference, scale=floor) <= 1e-15


@pytest.mark.parametrize("name", ["OZ2-N14", "OZ1-S7"])
def test_one_modulus_or_slice_fewer_misses_fp64(fp64_case, name):
    # records the smallest sizes: N = 15 moduli, s = 8 slices at k = 512, standard normal
    A, B, reference, *_ = fp64_case
    assert _nerr(get_type(name).gemm(A, B, DSA("a100")), reference, A, B) > 1e-15


def test_df32_is_close_to_fp64_on_the_vector_unit_only():
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((40, 48)), rng.standard_normal((48, 24))
    dsa = DSA("a100")
    C = TYPES["DF32"].gemm(A, B, dsa)
    assert _nerr(C, _exact_gemm(A, B), A, B) < 1e-13
    assert set(dsa.counters.flops_by_unit) == {"vector:fp32"}
    assert dsa.counters.ops["df_dot"].flops == 37 * 4 * 40 * 48 * 24
    with pytest.raises(RangeError, match="2\\^-40"):
        TYPES["DF32"].gemm(A * 2.0**45, B, dsa)


@pytest.mark.parametrize("name", [n for n in TYPES if n != "DF32"])
def test_counters_show_native_gemms_on_the_right_unit(name):
    t = TYPES[name]
    m, k, n = 24, 40, 16
    rng = np.random.default_rng(0)
    if t.family == "int16":
        A, B = rng.integers(-300, 300, (m, k)), rng.integers(-300, 300, (k, n))
    elif t.family == "fp64":
        A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    else:
        A, B = _uniform((m, k), 1), _uniform((k, n), 2)
    dsa = DSA("a100")
    t.gemm(A, B, dsa)
    matrix = {u: f for u, f in dsa.counters.flops_by_unit.items() if u.startswith("matrix:")}
    assert matrix == {f"matrix:{t.native}": t.native_gemms * 2 * m * n * k}
    assert dsa.counters.ops[f"mm_{t.native}"].calls == t.native_gemms
    # splitting and merging are charged to the vector unit
    assert dsa.counters.flops_by_unit.get("vector:fp32", 0) > 0 or t.native_gemms == 1


@pytest.mark.parametrize("name", list(TYPES))
def test_observed_error_within_the_a_priori_bound(name):
    t = TYPES[name]
    rng = np.random.default_rng(9)
    k = 64 if name == "DF32" else 128
    cases = []
    if t.family == "int16":
        cases.append((rng.integers(-32896, 32640, (32, k)), rng.integers(-32896, 32640, (k, 24))))
    elif t.family == "fp64":
        cases.append((rng.standard_normal((32, k)), rng.standard_normal((k, 24))))
        cases.append((rng.uniform(0, 1, (32, k)), rng.uniform(0, 1, (k, 24))))
    else:
        cases.append((_uniform((32, k), 1), _uniform((k, 24), 2)))
        if t.fits_range(_wide((32, k), 3)):
            cases.append((_wide((32, k), 3), _wide((k, 24), 4)))
    for A, B in cases:
        C = t.gemm(A, B, DSA("a100"))
        if t.family == "int16":
            assert np.array_equal(C.astype(object), naive.exact_int_gemm(A, B))
            assert t.error_bound(k) == 0
            continue
        ref = _exact_gemm(A, B) if t.family == "fp64" else naive.gemm_reference(A, B)
        assert bound_metric(t, C, ref, A, B) <= t.error_bound(k)


def test_range_checks_follow_the_spread_within_rows_not_the_magnitude():
    dsa = DSA("a100")
    # rows and columns are scaled by powers of two, so magnitude alone is no problem ...
    big = np.array([[2.0**15, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert TYPES["FP32-F"].fits_range(big)
    C = TYPES["FP32-F"].gemm(big, np.eye(2, dtype=np.float32), dsa)
    assert np.array_equal(C, big)
    assert TYPES["FP16"].fits_range(np.float32([[70000.0]]))
    huge = np.array([[1e30, -1e30], [1.0, 0.0]], dtype=np.float32)
    assert TYPES["FP32-B"].fits_range(huge)
    assert np.array_equal(TYPES["FP32-B"].gemm(huge, np.eye(2, dtype=np.float32), dsa), huge)
    # ... but the spread within a row is: fp16 pieces stay normal only down to 2^-14 below a
    # maximum scaled into [2^14, 2^15), about 2^28 of spread
    for spread, ok in ((2.0**-27, True), (2.0**-30, False)):
        row = np.array([[1.0, spread]], dtype=np.float32)
        for name in ("FP16", "FP32-F"):
            assert TYPES[name].fits_range(row) is ok, (name, spread)
    with pytest.raises(RangeError, match="spread too widely"):
        TYPES["FP32-F"].gemm(np.float32([[1.0, 2.0**-30]]), np.float32([[0.0], [1.0]]), dsa)
    # bf16 keeps float32's exponent range: the same row is fine
    assert TYPES["FP32-B"].fits_range(np.float32([[1.0, 2.0**-30]]))


def test_results_beyond_float32_are_refused_not_returned():
    dsa = DSA("a100")
    for name in FP32_FAMILY:
        etype = TYPES[name]
        with pytest.raises(RangeError, match="overflow"):
            etype.gemm(np.float32([[1e30]]), np.float32([[1e30]]), dsa)
        # 1e-36 * 1e-36 underflows float32: native gives 0, a type must not vouch for it
        tiny = np.full((4, 4), 1e-36, dtype=np.float32)
        with pytest.raises(RangeError, match="subnormal"):
            etype.gemm(tiny, tiny, dsa)


@pytest.mark.parametrize("name", FP32_FAMILY)
@pytest.mark.parametrize("scale_a,scale_b", [(1e-8, 1e-8), (1e-20, 1.0), (1e-36, 1e30),
                                             (1e-40, 1e30), (1e15, 1e-15)])
def test_bound_holds_far_from_one_and_on_float32_subnormals(name, scale_a, scale_b):
    """Ape's FP32-F missed its bound below fp16's normal range (2.5e-4 against 1.6e-5 on
    1e-8 data; about 0 on 1e-36 data); fp32 subnormal inputs (1e-40) broke every type."""
    etype = TYPES[name]
    rng = np.random.default_rng(4)
    A = (rng.uniform(-1, 1, (12, 40)) * scale_a).astype(np.float32)
    B = (rng.uniform(-1, 1, (40, 9)) * scale_b).astype(np.float32)
    if scale_a == 1e-40:
        assert np.any(np.abs(A[A != 0]) < 2.0**-126)  # really float32 subnormals
    assert etype.fits_range(A, B)
    C = etype.gemm(A, B, DSA("a100"))
    ref = naive.gemm_reference(A, B)
    assert bound_metric(etype, C, ref, A, B) <= etype.error_bound(40)


def _elementwise_case(n, seed):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    rows, cols = np.divmod(np.arange(n * n), n)
    exact = naive.exact_pairs(naive.exact_gemm_entries(A, B, rows, cols))
    return A, B, rows, cols, exact


def test_ozaki1_elementwise_error_keeps_falling_with_s():
    """Ozaki I used to add its levels smallest first in float64 and stopped improving at
    about 1e-13 (at 512^3; 2.4e-15 at this 128^3) relative to the small entries, from
    s = 10 on; summed error-free it reaches float64 accuracy of every entry. The 512^3
    figure: `furnace reproduce emulation` (ozaki1_slices)."""
    A, B, rows, cols, exact = _elementwise_case(128, 11)
    errors = []
    for s in range(6, 13):
        C = get_type(f"OZ1-S{s}").gemm(A, B, DSA("a100"))
        errors.append(naive.elementwise_relative_error(C, A, B, rows, cols, exact))
    # each slice adds 7 bits until float64's own rounding of the entry is all that is left
    assert all(later <= earlier * 1.01 for earlier, later in zip(errors, errors[1:])), errors
    assert errors[0] > 1e-9 and errors[2] > 1e-14  # the truncation-limited regime
    assert errors[-1] <= 1e-15
    assert errors[-1] <= 2.0**-53 * 1.01  # correctly rounded up to the last bit's half
    # native float64 GEMM is not elementwise accurate (it does not claim to be)
    assert naive.elementwise_relative_error(A @ B, A, B, rows, cols, exact) > 1e-15


def test_ozaki1_sum_of_levels_is_error_free_against_python_ints():
    # exact integer data: every level is exact, so the result must be the exact product
    rng = np.random.default_rng(2)
    A = rng.integers(-2**20, 2**20, (16, 64)).astype(np.float64)
    B = rng.integers(-2**20, 2**20, (64, 12)).astype(np.float64)
    C = get_type("OZ1-S10").gemm(A, B, DSA("a100"))
    exact = naive.exact_int_gemm(A.astype(np.int64), B.astype(np.int64))
    assert np.array_equal(C, exact.astype(np.float64))


FLOAT_TYPES = [n for n, t in TYPES.items() if t.family != "int16"]


@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_nan_and_inf_propagate_as_a_native_gemm_does(name):
    import torch

    etype = TYPES[name]
    dtype = np.float64 if etype.family == "fp64" else np.float32
    rng = np.random.default_rng(8)
    A = rng.uniform(-1, 1, (9, 7)).astype(dtype)
    B = rng.uniform(-1, 1, (7, 8)).astype(dtype)
    A[1, 2], A[3, 0], A[4, 4], A[5, 1] = np.nan, np.inf, -np.inf, np.inf
    A[5, 3] = -np.inf  # +inf and -inf terms in one row: NaN
    B[2, 1], B[6, 5], B[0, 6] = np.inf, np.nan, 0.0  # inf * 0 in row 3: NaN at (3, 6)
    C = etype.gemm(A, B, DSA("a100"))
    native = (torch.from_numpy(A) @ torch.from_numpy(B)).numpy()
    special = ~np.isfinite(native)
    assert special.any() and (~special).any()
    np.testing.assert_array_equal(np.isnan(C), np.isnan(native))
    np.testing.assert_array_equal(C[np.isinf(native)], native[np.isinf(native)])
    # the finite entries keep the type's bound (rows / columns without specials)
    keep_r, keep_c = np.isfinite(A).all(axis=1), np.isfinite(B).all(axis=0)
    Af, Bf = A[keep_r], B[:, keep_c]
    ref = _exact_gemm(Af, Bf) if dtype == np.float64 else naive.gemm_reference(Af, Bf)
    assert bound_metric(etype, C[np.ix_(keep_r, keep_c)], ref, Af, Bf) <= etype.error_bound(7)


def test_ieee_classification_matches_torch_on_random_special_patterns():
    import torch

    from furnace.emulation.types import ieee_nonfinite_products

    rng = np.random.default_rng(0)
    values = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -2.0])
    for _ in range(50):
        A = rng.choice(values, (5, 4), p=[0.05, 0.1, 0.1, 0.25, 0.25, 0.25])
        B = rng.choice(values, (4, 6), p=[0.05, 0.1, 0.1, 0.25, 0.25, 0.25])
        native = (torch.from_numpy(A) @ torch.from_numpy(B)).numpy()
        ours = ieee_nonfinite_products(A, B)
        special = ~np.isfinite(native)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(native))
        np.testing.assert_array_equal(ours[special], native[special])
        assert np.all(ours[~special] == 0)


def test_int16_refuses_non_finite_and_non_integer_data():
    A = np.array([[1.0, np.nan]])
    with pytest.raises(RangeError, match="integers"):
        TYPES["INT16"].gemm(A, np.ones((2, 1)), DSA("a100"))
    assert not TYPES["INT16"].fits_range(np.array([[0.5]]))


def test_a_profile_without_bf16_refuses_fp32_b_but_runs_fp32_f():
    dsa = DSA("ascend910")
    A, B = _uniform((16, 16), 0), _uniform((16, 16), 1)
    with pytest.raises(NotNativeError, match="bf16"):
        TYPES["FP32-B"].gemm(A, B, dsa)
    assert dsa.counters.calls == 0
    C = TYPES["FP32-F"].gemm(A, B, dsa)
    assert _nerr(C, naive.gemm_reference(A, B), A, B) < 1e-6


def test_fp32_types_refuse_inputs_that_float32_would_round():
    A = np.full((2, 2), 1 + 2.0**-40)
    with pytest.raises(TypeError, match="not exact in float32"):
        TYPES["FP32-B"].gemm(A, A, DSA("a100"))
