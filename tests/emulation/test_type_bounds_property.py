"""Property test: every emulated type keeps its a-priori error bound or refuses the data.

Ape (Ma et al., ICS '22) states an error analysis per emulated type (design note
`emulated_types.md` sections 2.2, 6.4 and 6.8). Hypothesis draws operands whose rows of A
and columns of B sit at magnitudes anywhere from 2^-40 to 2^40, with spreads of magnitude
within them, zeros (entries, whole rows and columns), rounding ties, cancellation and
several inner dimensions k. For EVERY registered type (and Ozaki I at s = 12) either
``fits_range`` accepts the data and the observed error, against exact rational dot
products, is within ``error_bound(k)``, or it refuses and ``gemm`` raises `RangeError`;
never a silent answer outside the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from furnace.emulation import splits
from furnace.emulation.dsa import DSA
from furnace.emulation.naive import exact_gemm_entries, exact_int_gemm
from furnace.emulation.types import TYPES, RangeError, bound_metric, get_type

NAMES = [*TYPES, "OZ1-S12"]
# type -> [examples within the bound, examples refused, smallest and largest binade tested]
SEEN: dict[str, list] = {name: [0, 0, 99, -99] for name in NAMES}

KINDS = ("random", "normalised", "ties", "cancel", "one_large", "zeros", "integers")


def _operands(seed, k, lo, hi, spread, kind):
    """A (7 x k), B (k x 5) with row / column binades in [lo, hi] and entries spread over
    2^-spread below them."""
    rng = np.random.default_rng(seed)

    def make(shape, axis):
        mant = rng.uniform(-1, 1, shape)
        if kind in ("normalised", "integers"):
            mant = np.sign(mant) * rng.uniform(0.5, 1, shape)
        x = mant * 2.0 ** -rng.integers(0, spread + 1, shape)
        if kind == "ties":
            # values on fp16/bf16 rounding midpoints: 1 + odd multiples of half an ulp
            x = np.sign(mant) * (1 + (2 * rng.integers(0, 64, shape) + 1) * 2.0**-12)
        elif kind == "cancel":
            x[..., ::2] = 1.0
            x[..., 1::2] = -1.0 + rng.uniform(-1e-3, 1e-3, x[..., 1::2].shape)
        elif kind == "one_large":
            x.flat[rng.integers(0, x.size)] = 2.0**6
        elif kind == "zeros":
            x[rng.random(shape) < 0.3] = 0.0
            x[rng.integers(0, shape[0])] = 0.0  # a zero row of A / zero column of B ...
            x[:, rng.integers(0, shape[1])] = 0.0  # ... and a zero column / row
        # one binade per row of A, per column of B: mixed magnitudes within one GEMM
        binade = rng.integers(lo, hi + 1, shape[0] if axis == 1 else shape[1])
        x = np.ldexp(x, binade.reshape((-1, 1) if axis == 1 else (1, -1)))
        if kind == "integers":
            x = np.trunc(np.ldexp(mant, rng.integers(0, 16, shape)))
        return x

    return make((7, k), 1), make((k, 5), 0)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), k=st.sampled_from([1, 3, 24, 64]),
       lo=st.integers(-40, 40), width=st.integers(0, 80), spread=st.integers(0, 24),
       kind=st.sampled_from(KINDS))
@example(seed=1, k=24, lo=-40, width=0, spread=0, kind="normalised")  # the bottom end
@example(seed=2, k=24, lo=40, width=0, spread=0, kind="normalised")  # the top end
@example(seed=3, k=24, lo=-40, width=80, spread=4, kind="random")  # rows at both ends
@example(seed=4, k=64, lo=-20, width=0, spread=0, kind="zeros")
@example(seed=5, k=24, lo=0, width=0, spread=0, kind="integers")
def test_bound_holds_or_the_type_refuses(name, seed, k, lo, width, spread, kind):
    etype = get_type(name)
    A64, B64 = _operands(seed, k, lo, min(lo + width, 40), spread, kind)
    if etype.family == "int16":
        A, B = A64, B64
    elif etype.family == "fp64":
        A, B = A64, B64
    else:
        A, B = A64.astype(np.float32), B64.astype(np.float32)
    record = SEEN[name]
    if not etype.fits_range(A, B):
        with pytest.raises(RangeError):
            etype.gemm(A, B, DSA("a100"))
        record[1] += 1
        return
    C = etype.gemm(A, B, DSA("a100"))
    if etype.family == "int16":
        assert np.array_equal(C.astype(object), exact_int_gemm(A.astype(np.int64),
                                                                B.astype(np.int64)))
    else:
        rows, cols = np.divmod(np.arange(A.shape[0] * B.shape[1]), B.shape[1])
        exact = exact_gemm_entries(A.astype(np.float64), B.astype(np.float64), rows, cols)
        ref = np.array([float(e) for e in exact]).reshape(A.shape[0], B.shape[1])
        observed = bound_metric(etype, C, ref, A, B)
        # the reference rounded to float64 adds at most u64 |C| to the observed error
        slack = 2.0**-52 if etype.family == "fp64" else 0.0
        assert observed <= etype.error_bound(k) * (1 + 1e-9) + slack, (observed, kind)
    record[0] += 1
    if kind != "integers":
        record[2] = min(record[2], lo)
        record[3] = max(record[3], min(lo + width, 40))


def test_every_type_was_exercised_at_both_ends_of_the_range():
    # runs after the parametrised cases in file order
    wide = {"BF16", "TF32", "FP16", "BF16x2", "FP32-F", "FP32-T", "FP32-B", "FP32-B9", "DF32"}
    wide |= {n for n in NAMES if n.startswith("OZ")}
    for name, (tested, refused, low, high) in SEEN.items():
        assert tested > 0, f"no example reached {name} ({refused} refused)"
        if name in wide:
            assert low <= -40 and high >= 40, (name, low, high)


def test_int16_refuses_what_two_bytes_cannot_hold():
    A = np.array([[splits.INT16C_MAX + 1.0]])
    with pytest.raises(RangeError, match="integers"):
        TYPES["INT16"].gemm(A, np.ones((1, 1)), DSA("a100"))
