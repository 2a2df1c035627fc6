"""Tests of `furnace.emulation.naive`: exact GEMM references and error metrics.

Design note `emulated_types.md` sections 4.4 and 6.4: exact entries must agree with
float64 where float64 is exact, with Fractions everywhere, and the metrics must give the
hand-computed values.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from furnace.emulation import naive


@settings(max_examples=30, deadline=None)
@given(
    A=hnp.arrays(np.float64, (3, 6), elements=st.integers(-1000, 1000).map(float)),
    B=hnp.arrays(np.float64, (6, 4), elements=st.integers(-1000, 1000).map(float)),
)
def test_exact_entries_agree_with_float64_on_small_integers(A, B):
    rows, cols = naive.sample_entries(3, 4, 100)
    exact = naive.exact_gemm_entries(A, B, rows, cols)
    ref = naive.gemm_reference(A, B)
    assert [float(v) for v in exact] == ref[rows, cols].tolist()
    assert all(isinstance(v, Fraction) for v in exact)


@settings(max_examples=30, deadline=None)
@given(
    A=hnp.arrays(np.float64, (2, 5), elements=st.floats(-1e150, 1e150, allow_nan=False)),
    B=hnp.arrays(np.float64, (5, 3), elements=st.floats(-1e150, 1e150, allow_nan=False)),
)
def test_exact_entries_equal_fraction_sums(A, B):
    rows, cols = naive.sample_entries(2, 3, 6)
    exact = naive.exact_gemm_entries(A, B, rows, cols)
    for t, (i, j) in enumerate(zip(rows, cols)):
        want = sum((Fraction(A[i, k]) * Fraction(B[k, j]) for k in range(5)), Fraction(0))
        assert exact[t] == want


def test_exact_entries_see_what_float64_loses():
    A = np.array([[1.0, 2.0**-60, -1.0]])
    B = np.array([[1.0], [1.0], [1.0]])
    exact = naive.exact_gemm_entries(A, B, [0], [0])
    assert exact[0] == Fraction(1, 2**60)
    assert naive.longdouble_gemm(A, B).shape == (1, 1)


def test_exact_int_gemm_is_exact_beyond_int64():
    A = np.array([[2**62, 3]], dtype=np.int64)
    B = np.array([[4], [5]], dtype=np.int64)
    C = naive.exact_int_gemm(A, B)
    assert C[0, 0] == 2**64 + 15
    with pytest.raises(TypeError):
        naive.exact_int_gemm(np.ones((1, 2)), B)


def test_normwise_error_hand_example():
    C_ref = np.array([[3.0, 4.0]])  # ||.||_F = 5
    C = np.array([[3.0, 4.5]])
    assert naive.normwise_error(C, C_ref) == pytest.approx(0.1, rel=1e-15)
    assert naive.normwise_error(C_ref, C_ref) == 0.0
    assert naive.normwise_error(np.zeros(2), np.zeros(2)) == 0.0
    assert naive.normwise_error(np.ones(2), np.zeros(2)) == math.inf
    big = np.array([1e300, 1e300])
    assert naive.normwise_error(big * 1.5, big) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shapes"):
        naive.normwise_error(np.ones(2), np.ones(3))


def test_normwise_error_floor_tied_to_the_inputs():
    A = np.array([[1.0, 1.0]])
    B = np.array([[1.0], [-1.0]])  # A @ B = 0 exactly
    floor = naive.gemm_floor(A, B)
    assert floor == pytest.approx(math.sqrt(2) * math.sqrt(2) / 2)
    # without the floor a rounding error against a zero reference is infinite
    assert naive.normwise_error(np.array([[1e-16]]), np.zeros((1, 1))) == math.inf
    assert naive.normwise_error(np.array([[1e-16]]), np.zeros((1, 1)), scale=floor) == \
        pytest.approx(1e-16)
    # a reference above the floor is unaffected
    assert naive.normwise_error(np.array([[3.0, 4.5]]), np.array([[3.0, 4.0]]), scale=1.0) \
        == pytest.approx(0.1, rel=1e-15)
    with pytest.raises(ValueError, match="positive"):
        naive.normwise_error(np.ones(2), np.ones(2), scale=0.0)


def test_elementwise_relative_error_hand_example():
    A = np.array([[1.0, 1.0], [1e-3, 0.0], [0.0, 0.0]])
    B = np.array([[1.0], [-1.0 + 2.0**-30]])
    rows, cols = np.array([0, 1, 2]), np.array([0, 0, 0])
    exact = naive.exact_gemm_entries(A, B, rows, cols)  # 2^-30, 1e-3, 0
    C = np.array([[2.0**-30 * (1 + 2.0**-20)], [1e-3 * (1 + 1e-9)], [0.0]])
    got = naive.elementwise_relative_error(C, A, B, rows, cols, exact)
    assert got == pytest.approx(2.0**-20, rel=1e-6)  # each entry against itself
    # a cancelled entry far below the floor u64 (|A||B|)_ij = u64 * 2 counts against that
    C[0, 0] = 0.0
    assert naive.elementwise_relative_error(C, A, B, rows, cols, exact) == 1.0
    assert naive.elementwise_relative_error(C, A, B, rows, cols, exact, floor=2.0**-20) == \
        pytest.approx(2.0**-30 / (2.0**-20 * 2))
    # (|A||B|)_ij = 0 (the zero row): exact zero counts 0, anything else inf
    C[0, 0] = 2.0**-30
    C[2, 0] = 1e-300
    assert naive.elementwise_relative_error(C, A, B, rows, cols, exact) == math.inf
    hi, lo = naive.exact_pairs(exact)
    assert hi[0] == 2.0**-30 and np.all(lo == 0)


def test_exact_pairs_hold_what_float64_cannot():
    x = Fraction(1) + Fraction(1, 2**80)
    hi, lo = naive.exact_pairs([x])
    assert hi[0] == 1.0 and lo[0] == 2.0**-80


def test_componentwise_error_hand_example():
    A = np.array([[1.0, -2.0], [0.0, 0.0]])
    B = np.array([[3.0], [1.0]])
    C_ref = A @ B  # [[1], [0]], |A||B| = [[5], [0]]
    C = C_ref + np.array([[0.5], [0.0]])
    assert naive.componentwise_error(C, C_ref, A, B) == pytest.approx(0.1)
    assert naive.componentwise_error(C_ref + [[0], [1e-30]], C_ref, A, B) == math.inf
    with pytest.raises(ValueError, match="shapes"):
        naive.componentwise_error(np.ones((3, 1)), np.ones((3, 1)), A, B)


def test_sampled_componentwise_error_uses_exact_difference():
    A = np.array([[1.0, 2.0**-60]])
    B = np.array([[1.0], [1.0]])
    C = A @ B  # float64 drops 2^-60
    err = naive.sampled_componentwise_error(C, A, B, [0], [0])
    assert err == pytest.approx(2.0**-60 / (1 + 2.0**-60))


def test_bits_correct():
    assert naive.bits_correct(2.0**-24) == 24
    assert naive.bits_correct(0.0) == math.inf
    with pytest.raises(ValueError):
        naive.bits_correct(-1.0)
    with pytest.raises(ValueError):
        naive.bits_correct(float("nan"))


def test_sample_entries_distinct_and_in_range():
    rows, cols = naive.sample_entries(10, 7, 30, rng=0)
    assert len(set(zip(rows.tolist(), cols.tolist()))) == 30
    assert rows.max() < 10 and cols.max() < 7
    rows, cols = naive.sample_entries(2, 2, 10)
    assert len(rows) == 4
    with pytest.raises(ValueError):
        naive.sample_entries(0, 2, 1)


def test_reference_rejects_bad_input():
    with pytest.raises(ValueError, match="inner"):
        naive.gemm_reference(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        naive.exact_gemm_entries(np.array([[np.nan]]), np.ones((1, 1)), [0], [0])
    with pytest.raises(IndexError):
        naive.exact_gemm_entries(np.ones((1, 1)), np.ones((1, 1)), [1], [0])
    with pytest.raises(ValueError, match="2-D"):
        naive.longdouble_gemm(np.ones(3), np.ones((3, 1)))


def test_fp32_reference_matches_exact_for_fp32_inputs():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((8, 64)).astype(np.float32)
    B = rng.standard_normal((64, 8)).astype(np.float32)
    rows, cols = naive.sample_entries(8, 8, 64)
    exact = naive.exact_gemm_entries(A, B, rows, cols)
    err = naive.sampled_componentwise_error(naive.gemm_reference(A, B), A, B, rows, cols, exact)
    assert err <= 64 * 2.0**-53
