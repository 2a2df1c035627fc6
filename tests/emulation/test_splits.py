"""Property tests of `furnace.emulation.splits`: Ape splits, Ozaki I/II, double-float.

Checks the exactness claims of design note `emulated_types.md` sections 2.2, 4.2, 4.3 and
6.3 (Ma et al., ICS '22; Ozaki et al. 2012; Ozaki, Uchino, Imamura 2024/2025; Dekker 1971,
Joldes-Muller-Popescu 2017) against exact Fraction / Python-int arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from furnace.emulation import formats, splits
from furnace.emulation.naive import exact_int_gemm

F32 = np.float32
U32 = 2.0**-24

# finite float32 values away from overflow, so splits and Dekker products stay in range
f32_moderate = st.floats(
    min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32
)
f32_arrays = hnp.arrays(np.float32, st.integers(1, 16), elements=f32_moderate)

APE_RECIPES = [
    # (format, pieces, scale exponent, smallest |x| for which pieces stay normal)
    (formats.FP16, 2, 12, 2.0**-12),
    (formats.BF16, 3, 0, 2.0**-100),
    (formats.TF32, 2, 0, 2.0**-100),
]


def _frac(x) -> Fraction:
    return Fraction(float(x))


# ---------------------------------------------------------------- float splits


@pytest.mark.parametrize("fmt,pieces,scale,tiny", APE_RECIPES, ids=["fp16F", "bf16B", "tf32T"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_split_float_reconstructs_exactly_and_meets_bound(fmt, pieces, scale, tiny, data):
    limit = 32767.0 if fmt is formats.FP16 else 2.0**100
    x = data.draw(
        hnp.arrays(
            np.float32,
            st.integers(1, 12),
            elements=st.floats(-limit, limit, allow_nan=False, width=32),
        )
    )
    split = splits.split_float(x, fmt, pieces, scale)
    assert len(split.pieces) == pieces
    for p in split.pieces:
        assert p.dtype == np.float32
        assert np.all(formats.is_representable(p, fmt))
    u = fmt.unit_roundoff
    for t in range(x.size):
        total = sum(
            (_frac(p[t]) * Fraction(2) ** (-i * scale) for i, p in enumerate(split.pieces)),
            Fraction(0),
        )
        residual = _frac(split.residual[t])
        assert total + residual == _frac(x[t])
        if abs(float(x[t])) >= tiny:
            assert abs(residual) <= Fraction(u) ** pieces * abs(_frac(x[t]))


def test_split_float_ape_f_scaled_low_part_stays_normal_for_small_data():
    # unscaled fp16 pieces go subnormal near 1e-5 (Markidis), the 2^12 scaling does not
    x = np.float32([3.3e-5, 1.7e-4, 0.013])
    scaled = splits.split_float(x, formats.FP16, 2, 12)
    assert np.all(np.abs(scaled.residual) <= 2.0**-22 * np.abs(x))
    unscaled = splits.split_float(x, formats.FP16, 2, 0)
    assert np.abs(unscaled.residual[0]) > 2.0**-22 * abs(float(x[0]))


def test_split_float_fp16_low_part_overflows_above_2_15():
    # fp16's ulp is 32 on [2^15, 2^16): a residual of 16 scaled by 2^12 is 65536 > 65504, so
    # Ape's FP32F_MAX = 65504 is too loose; the split refuses rather than produce inf
    with pytest.raises(OverflowError, match="piece 1"):
        splits.split_float(np.float32([41360.0]), formats.FP16, 2, 12)
    ok = splits.split_float(np.float32([32767.0, -32767.0]), formats.FP16, 2, 12)
    assert np.all(np.isfinite(ok.pieces[1]))


def test_split_float_rejects_bad_input():
    with pytest.raises(OverflowError, match="fp16"):
        splits.split_float(np.float32([7e4]), formats.FP16, 2, 12)
    with pytest.raises(ValueError, match="non-finite"):
        splits.split_float(np.float32([np.nan]), formats.BF16, 3)
    with pytest.raises(ValueError, match="float32"):
        splits.split_float(np.float64([0.1]), formats.BF16, 3)
    with pytest.raises(ValueError, match="pieces"):
        splits.split_float(np.float32([1.0]), formats.BF16, 0)
    with pytest.raises(ValueError, match="unknown float format"):
        splits.split_float(np.float32([1.0]), "fp12", 2)


@given(hnp.arrays(np.int16, st.integers(1, 50), elements=st.integers(-32768, 32639)))
def test_split_int16_reconstructs(x):
    h, l = splits.split_int16_to_int8(x)
    assert h.dtype == np.int8 and l.dtype == np.int8
    assert np.array_equal(256 * h.astype(np.int64) + l.astype(np.int64), x.astype(np.int64))


def test_split_int16_edges_and_errors():
    h, l = splits.split_int16_to_int8(np.array([splits.INT16C_MAX, splits.INT16C_MIN, -32768]))
    assert h.tolist() == [127, -128, -128] and l.tolist() == [127, -128, 0]
    for bad in (32640, 32767, -32897):
        with pytest.raises(ValueError, match="32639"):
            splits.split_int16_to_int8(np.array([bad]))
    with pytest.raises(TypeError):
        splits.split_int16_to_int8(np.array([1.5]))


# ---------------------------------------------------------------- Ozaki scheme I


def test_ozaki1_beta_keeps_int32_exact():
    assert splits.ozaki1_beta(1) == 7
    assert splits.ozaki1_beta(2**17) == 7
    assert splits.ozaki1_beta(2**17 + 1) == 6
    for k in (1, 3, 1000, 2**17, 2**20, 12345678, 2**29):
        beta = splits.ozaki1_beta(k)
        assert k * (2**beta - 1) ** 2 < 2**31
    with pytest.raises(ValueError):
        splits.ozaki1_beta(2**30)
    with pytest.raises(ValueError):
        splits.ozaki1_beta(0)


def _truncated(a: float, e: int, bits: int) -> Fraction:
    scaled = Fraction(a) * Fraction(2) ** (bits - e)
    return Fraction(math.trunc(scaled)) * Fraction(2) ** (e - bits)


@settings(max_examples=40, deadline=None)
@given(
    A=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 4), st.integers(1, 5)),
        elements=st.floats(-1e200, 1e200, allow_nan=False),
    ),
    num_slices=st.integers(1, 9),
    beta=st.integers(1, 7),
    axis=st.sampled_from([0, 1]),
)
def test_ozaki_slices_sum_to_truncated_input(A, num_slices, beta, axis):
    sl = splits.ozaki_slices(A, num_slices, beta, axis)
    assert len(sl.slices) == num_slices
    for s in sl.slices:
        assert s.dtype == np.int8
        assert np.all(np.abs(s.astype(np.int64)) <= 2**beta - 1)
    bits = num_slices * beta
    for i in range(A.shape[0]):
        for j in range(A.shape[1]):
            e = int(sl.exponents[i] if axis == 1 else sl.exponents[j])
            total = sum(
                (
                    Fraction(int(s[i, j])) * Fraction(2) ** (e - beta * (t + 1))
                    for t, s in enumerate(sl.slices)
                ),
                Fraction(0),
            )
            assert total == _truncated(float(A[i, j]), e, bits)
            assert abs(total - Fraction(float(A[i, j]))) < Fraction(2) ** (e - bits)


def test_ozaki_reconstruct_is_exact_within_53_bits():
    A = np.random.default_rng(1).standard_normal((6, 7)) * np.exp(np.arange(7))
    sl = splits.ozaki_slices(A, 8, 6, 0)  # 48 bits
    rec = splits.ozaki_reconstruct(sl)
    assert np.all(np.abs(rec - A) < np.ldexp(1.0, sl.exponents - 48)[None, :])
    full = splits.ozaki_slices(A, 9, 7, 1)  # 63 bits > 53: reconstruction gives A back
    assert np.array_equal(splits.ozaki_reconstruct(full), A)


def test_ozaki_reconstruct_beyond_53_bits_is_the_nearest_float64():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((5, 6))
    sl = splits.ozaki_slices(A, 12, 7, 1)  # 84 bits: the slices hold A exactly
    assert np.array_equal(splits.ozaki_reconstruct(sl), A)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False), min_size=1, max_size=12))
def test_compensated_sum_is_as_if_twice_the_precision(values):
    terms = [np.array([v]) for v in values]
    hi, lo = splits.compensated_sum(terms)
    exact = sum(Fraction(v) for v in values)
    # Sum2 (Ogita, Rump, Oishi 2005): u|S| + gamma_(n-1)^2 sum|x|
    n, u = len(values), 2.0**-53
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    bound = u * abs(exact) + Fraction(gamma**2) * sum(abs(Fraction(v)) for v in values)
    assert abs(Fraction(float(hi[0] + lo[0])) - exact) <= bound


def test_compensated_sum_recovers_what_a_plain_sum_loses():
    terms = [np.array([1.0]), np.array([2.0**-60]), np.array([-1.0])]
    hi, lo = splits.compensated_sum(terms)
    assert hi[0] + lo[0] == 2.0**-60  # a plain float64 sum gives 0


def test_pow2_shifts_put_the_maxima_in_one_binade():
    X = np.array([[3.0, -0.5], [0.0, 0.0], [1e-30, 2e-30]], dtype=np.float32)
    t = splits.pow2_shifts(X, axis=1, top=15)
    assert t[1] == 0
    scaled = np.ldexp(np.abs(X[[0, 2]]).max(axis=1).astype(np.float64), t[[0, 2]])
    assert np.all((scaled >= 2.0**14) & (scaled < 2.0**15))
    cols = splits.pow2_shifts(X, axis=0, top=0)
    assert np.all(np.ldexp(np.abs(X).max(axis=0).astype(np.float64), cols) >= 0.5)


def test_ozaki_slices_reject_bad_input():
    A = np.ones((2, 2))
    with pytest.raises(ValueError, match="beta"):
        splits.ozaki_slices(A, 3, 8, 1)
    with pytest.raises(ValueError, match="axis"):
        splits.ozaki_slices(A, 3, 7, 2)
    with pytest.raises(ValueError, match="non-finite"):
        splits.ozaki_slices(np.array([[np.inf, 1.0]]), 3, 7, 1)
    with pytest.raises(ValueError, match="2-D"):
        splits.ozaki_slices(np.ones(3), 3, 7, 1)


# ---------------------------------------------------------------- Ozaki scheme II (CRT)


def test_crt_moduli_are_the_gemmul8_table_and_coprime():
    mods = splits.crt_moduli(20)
    assert mods == [256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199,
                    197, 193, 191, 181, 179, 173]
    for i in range(len(mods)):
        for j in range(i):
            assert math.gcd(mods[i], mods[j]) == 1
    with pytest.raises(ValueError):
        splits.crt_moduli(0)
    with pytest.raises(ValueError, match="pairwise coprime"):
        splits.crt_moduli(1000)


@given(
    values=st.lists(st.integers(-(2**300), 2**300), min_size=1, max_size=20),
    p=st.sampled_from(splits.crt_moduli(20) + [2, 3, 128]),
)
def test_to_residues_matches_python_ints(values, p):
    x = np.array([float(v) for v in values])  # rounding keeps them integers
    r = splits.to_residues(x, p)
    assert r.dtype == np.int8
    for xi, ri in zip(x.tolist(), r.tolist()):
        assert (int(xi) - ri) % p == 0
        assert -p // 2 <= ri <= (p - 1) // 2


def test_to_residues_rejects_bad_input():
    with pytest.raises(ValueError, match="integer-valued"):
        splits.to_residues(np.array([0.5]), 251)
    with pytest.raises(ValueError, match="modulus"):
        splits.to_residues(np.array([1.0]), 257)
    with pytest.raises(ValueError, match="non-finite"):
        splits.to_residues(np.array([np.inf]), 251)


def _python_crt(residues: list[int], moduli: list[int]) -> int:
    P = math.prod(moduli)
    total = sum(r * (P // p) * pow(P // p, -1, p) for r, p in zip(residues, moduli)) % P
    return total - P if total > (P - 1) // 2 else total


@given(N=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
def test_garner_matches_python_int_crt_on_random_residues(N, seed):
    mods = splits.crt_moduli(N)
    rng = np.random.default_rng(seed)
    res = [rng.integers(-(2**31), 2**31, size=7) for _ in mods]
    digits = splits.garner_digits(res, mods)
    exact = splits.mixed_radix_to_int(digits, mods)
    approx = splits.crt_reconstruct(res, mods)
    for t in range(7):
        want = _python_crt([int(r[t]) for r in res], mods)
        assert exact[t] == want
        assert abs(Fraction(float(approx[t])) - want) <= Fraction(4 * N) * 2**-53 * abs(want)
        if abs(want) < 2**53:
            assert approx[t] == want


@given(values=st.lists(st.integers(-(2**50), 2**50), min_size=1, max_size=10))
def test_garner_balanced_digits_recover_negative_values(values):
    mods = splits.crt_moduli(8)
    res = [np.array([v % p for v in values]) for p in mods]  # non-negative residues in
    rec = splits.crt_reconstruct(res, mods)
    assert rec.tolist() == [float(v) for v in values]
    digits = splits.garner_digits(res, mods)
    for t, v in enumerate(values):
        if -128 <= v <= 127:
            assert digits[0, t] == v and np.all(digits[1:, t] == 0)


@settings(max_examples=10, deadline=None)
@given(k_log=st.integers(0, 10), N=st.integers(6, 16), seed=st.integers(0, 2**32 - 1))
def test_crt_gives_exact_integer_product(k_log, N, seed):
    k = 2**k_log
    mods = splits.crt_moduli(N)
    P = math.prod(mods)
    rng = np.random.default_rng(seed)
    # entries sized so |A'B'| < P/2 by the same Cauchy-Schwarz argument as the scaling
    bound = max(1, int(math.isqrt(P // (4 * k))))
    bound = min(bound, 2**62)
    A = rng.integers(-bound, bound, size=(3, k), endpoint=True)
    B = rng.integers(-bound, bound, size=(k, 4), endpoint=True)
    exact = exact_int_gemm(A, B)
    res = []
    for p in mods:
        rA = splits.to_residues(A, p).astype(np.int64)
        rB = splits.to_residues(B, p).astype(np.int64)
        res.append(rA @ rB)  # |sum| <= k * 128^2 fits easily in int64 (and int32 here)
    digits = splits.garner_digits(res, mods)
    assert np.array_equal(splits.mixed_radix_to_int(digits, mods), exact)
    approx = splits.crt_reconstruct(res, mods)
    for i in range(3):
        for j in range(4):
            want = int(exact[i, j])
            assert abs(Fraction(float(approx[i, j])) - want) <= Fraction(4 * N) * 2**-53 * abs(
                want
            )


def test_crt_reconstruct_rejects_bad_moduli():
    with pytest.raises(ValueError, match="coprime"):
        splits.crt_reconstruct([np.array([1]), np.array([1])], [4, 6])
    with pytest.raises(ValueError, match="residue arrays"):
        splits.crt_reconstruct([np.array([1])], [5, 7])
    with pytest.raises(TypeError):
        splits.crt_reconstruct([np.array([1.0])], [5])


@settings(max_examples=15, deadline=None)
@given(N=st.integers(4, 20), seed=st.integers(0, 2**32 - 1), spread=st.floats(0, 20))
def test_ozaki2_scaling_keeps_product_in_crt_range(N, seed, spread):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((4, 9)) * np.exp(spread * rng.standard_normal((4, 9)))
    B = rng.standard_normal((9, 3)) * np.exp(spread * rng.standard_normal((9, 3)))
    A[1] = 0.0  # a zero row must not break the scaling
    sa, sb = splits.ozaki2_scaling(A, B, N)
    Ai = splits.scale_to_integers(A, sa, axis=1)
    Bi = splits.scale_to_integers(B, sb, axis=0)
    assert np.all(Ai == np.trunc(Ai)) and np.all(Bi == np.trunc(Bi))
    P = math.prod(splits.crt_moduli(N))
    prod = exact_int_gemm(
        np.vectorize(int, otypes=[object])(Ai), np.vectorize(int, otypes=[object])(Bi)
    )
    assert max(abs(int(v)) for v in prod.ravel()) < P // 2
    # the shifts are tight: one more bit per side would break the Cauchy-Schwarz bound
    norms = np.linalg.norm(A, axis=1)
    nz = norms > 0
    assert np.all(np.ldexp(norms[nz], sa[nz] + 1) ** 2 > 2 ** (math.log2(P) - 1.5) / 4)


# ---------------------------------------------------------------- double-float


@given(a=f32_moderate, b=f32_moderate)
def test_two_sum_is_error_free(a, b):
    s, e = splits.two_sum(F32(a), F32(b))
    assert _frac(s) + _frac(e) == _frac(F32(a)) + _frac(F32(b))
    assert s == F32(a) + F32(b)


@given(a=f32_moderate, b=f32_moderate)
def test_fast_two_sum_is_error_free_when_ordered(a, b):
    if abs(a) < abs(b):
        a, b = b, a
    s, e = splits.fast_two_sum(F32(a), F32(b))
    assert _frac(s) + _frac(e) == _frac(F32(a)) + _frac(F32(b))


prod_operand = st.one_of(
    st.just(0.0),
    st.floats(2.0**-50, 2.0**50, width=32),
    st.floats(-(2.0**50), -(2.0**-50), width=32),
)


@given(a=prod_operand, b=prod_operand)
def test_two_prod_is_error_free(a, b):
    p, e = splits.two_prod(F32(a), F32(b))
    assert _frac(p) + _frac(e) == _frac(F32(a)) * _frac(F32(b))
    assert p == F32(a) * F32(b)


@given(x=hnp.arrays(np.float32, 20, elements=prod_operand))
def test_two_prod_vectorised(x):
    p, e = splits.two_prod(x, x[::-1])
    for t in range(x.size):
        assert _frac(p[t]) + _frac(e[t]) == _frac(x[t]) * _frac(x[::-1][t])


def _df(v: float, rng_scale: float) -> tuple[np.float32, np.float32]:
    hi = F32(v)
    lo = F32((v - float(hi)) * rng_scale)
    hi, lo = splits.fast_two_sum(hi, lo)  # normalised pair
    return hi, lo


df_value = st.one_of(st.floats(1e-10, 1e10), st.floats(-1e10, -1e-10))


@given(x=df_value, y=df_value, sx=st.floats(0, 1), sy=st.floats(0, 1))
def test_df_add_and_mul_meet_jmp_bounds(x, y, sx, sy):
    xh, xl = _df(x, sx)
    yh, yl = _df(y, sy)
    X = _frac(xh) + _frac(xl)
    Y = _frac(yh) + _frac(yl)
    sh, sl = splits.df_add(xh, xl, yh, yl)
    if X + Y != 0:
        assert abs(_frac(sh) + _frac(sl) - (X + Y)) <= (3 * U32**2 + 13 * U32**3) * abs(X + Y)
    else:
        assert sh == 0 and sl == 0
    ph, pl = splits.df_mul(xh, xl, yh, yl)
    assert abs(_frac(ph) + _frac(pl) - X * Y) <= 7 * Fraction(U32) ** 2 * abs(X * Y)
    # results are normalised double-floats
    assert ph == F32(ph + pl) and sh == F32(sh + sl)


@settings(max_examples=30, deadline=None)
@given(x=hnp.arrays(np.float32, st.integers(1, 64), elements=prod_operand), data=st.data())
def test_df_dot_error_bound(x, data):
    y = data.draw(hnp.arrays(np.float32, x.shape, elements=prod_operand))
    hi, lo = splits.df_dot(x, y)
    exact = sum((_frac(a) * _frac(b) for a, b in zip(x, y)), Fraction(0))
    abs_sum = sum((abs(_frac(a) * _frac(b)) for a, b in zip(x, y)), Fraction(0))
    k = x.size
    eps = 3 * U32**2 + 13 * U32**3
    assert abs(_frac(hi) + _frac(lo) - exact) <= (k - 1) * eps * (1 + eps) ** k * abs_sum


def test_df_dot_batched_and_beats_float32():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 300)).astype(F32)
    y = rng.standard_normal((5, 300)).astype(F32)
    hi, lo = splits.df_dot(x, y, axis=1)
    assert hi.shape == (5,)
    ref = np.sum(x.astype(np.float64) * y.astype(np.float64), axis=1)
    err = np.abs(hi.astype(np.float64) + lo.astype(np.float64) - ref)
    assert np.all(err <= 300 * 2.0**-46 * np.sum(np.abs(x * y.astype(np.float64)), axis=1))


def test_double_float_rejects_inexact_inputs():
    with pytest.raises(ValueError, match="float32"):
        splits.two_sum(np.float64(0.1), F32(1))
    with pytest.raises(ValueError, match="broadcast"):
        splits.df_dot(np.ones(3, F32), np.ones(4, F32))
    with pytest.raises(ValueError, match="axis"):
        splits.df_dot(F32(1), F32(2))
