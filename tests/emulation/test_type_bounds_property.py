"""Property test: every float type's error stays within its a-priori bound over random and
adversarial inputs (hypothesis draws the scale, exponent spread, signs and special values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from furnace.emulation.dsa import DSA
from furnace.emulation.naive import exact_gemm_entries
from furnace.emulation.types import TYPES, bound_metric

TESTED: dict[str, int] = {}

FLOAT_TYPES = [n for n, t in TYPES.items() if t.family in ("narrow", "fp32", "fp64")
               and n != "DF32"]


@st.composite
def operands(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    spread = draw(st.integers(0, 12))  # exponent spread within the data
    scale = draw(st.integers(-2, 14))  # overall binade
    kind = draw(st.sampled_from(["random", "ties", "cancel", "one_large"]))
    rng = np.random.default_rng(seed)
    shape_a, shape_b = (8, 48), (48, 6)

    def make(shape):
        x = rng.uniform(-1, 1, shape) * 2.0 ** rng.integers(-spread, 1, shape)
        if kind == "ties":
            # values on fp16/bf16 rounding midpoints: 1 + odd multiples of half an ulp
            x = np.sign(x) * (1 + (2 * rng.integers(0, 64, shape) + 1) * 2.0**-12)
        elif kind == "cancel":
            x[:, ::2] = 1.0
            x[:, 1::2] = -1.0 + rng.uniform(-1e-3, 1e-3, x[:, 1::2].shape)
        elif kind == "one_large":
            x.flat[rng.integers(0, x.size)] = 2.0 ** 6
        return x * 2.0**scale

    return make(shape_a), make(shape_b)


@pytest.mark.parametrize("name", FLOAT_TYPES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=operands())
def test_error_within_bound(name, data):
    etype = TYPES[name]
    A64, B64 = data
    if etype.family == "fp64":
        A, B = A64, B64
    else:
        A, B = A64.astype(np.float32), B64.astype(np.float32)
    if not etype.fits_range(A, B):
        return
    if etype.family != "fp64" and min(np.abs(A[A != 0]).min(initial=1.0),
                                      np.abs(B[B != 0]).min(initial=1.0)) < 2.0**-14:
        # the fp32 bounds assume normal narrow pieces (README: FP32-F below ~3e-5)
        return
    C = etype.gemm(A, B, DSA("a100"))
    rows, cols = np.divmod(np.arange(A.shape[0] * B.shape[1]), B.shape[1])
    exact = exact_gemm_entries(A.astype(np.float64), B.astype(np.float64), rows, cols)
    ref = np.array([float(e) for e in exact]).reshape(A.shape[0], B.shape[1])
    TESTED[name] = TESTED.get(name, 0) + 1
    observed = bound_metric(etype, C, ref, A, B)
    assert observed <= etype.error_bound(A.shape[1]) * (1 + 1e-6) + 1e-300


def test_the_property_test_exercised_every_type():
    # runs after the parametrised cases in file order: every type saw tested examples
    missing = [n for n in FLOAT_TYPES if TESTED.get(n, 0) == 0]
    assert not missing, f"no example reached {missing}"
