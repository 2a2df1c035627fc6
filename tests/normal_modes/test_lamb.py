"""Lamb (1882) homogeneous sphere: Poisson-solid roots, CONST ball frequencies, counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import spherical_jn

from furnace.normal_modes.lamb import (
    lamb_modes,
    radial_roots,
    spheroidal_det,
    spheroidal_roots,
    toroidal_roots,
)

# omega a / beta for lambda = mu (design note section 4.1, 6 significant digits)
POISSON = {
    ("S", 0): [4.44000, 10.4939],
    ("S", 1): [3.42453, 6.77129, 7.74521],
    ("S", 2): [2.63987, 4.86527, 8.32920],
    ("S", 3): [3.91634, 6.45437],
    ("S", 4): [5.00931],
    ("T", 1): [5.76346, 9.09501],
    ("T", 2): [2.50113, 7.13601],
    ("T", 3): [3.86470, 8.44492],
    ("T", 4): [5.09462],
}

CONST_MHZ = {
    "0T2": 0.36074, "0S2": 0.38074, "1S1": 0.49392, "0T3": 0.55740, "0S3": 0.56485,
    "0S0": 0.64038, "1S2": 0.70171, "0S4": 0.72249, "0T4": 0.73479, "1T1": 0.83126,
}  # fmt: skip


@pytest.mark.parametrize("key", list(POISSON))
def test_poisson_table(key):
    kind, l = key
    want = np.array(POISSON[key])
    if kind == "T":
        got = toroidal_roots(l, len(want))
    elif l == 0:
        got = radial_roots(len(want))
    else:
        got = spheroidal_roots(l, len(want))
    # 6 significant digits: half a unit in the last place is up to 5e-6 relative
    np.testing.assert_allclose(got, want, rtol=5e-6)


def test_lamb_classic_radial_value():
    # omega a / alpha of 0S0 for a Poisson solid (Lamb's 2.5634)
    assert radial_roots(1)[0] / math.sqrt(3.0) == pytest.approx(2.56344, abs=1e-5)


def test_roots_are_roots():
    y = toroidal_roots(1, 3)
    np.testing.assert_allclose(spherical_jn(2, y), 0.0, atol=1e-13)  # l = 1: j_2(y) = 0
    for l in (1, 2, 5):
        for y in spheroidal_roots(l, 3):
            h = 1e-6
            assert spheroidal_det(l, y - h) * spheroidal_det(l, y + h) < 0


def test_n_max_and_y_max_agree():
    a = spheroidal_roots(3, vp_vs=2.0, y_max=20.0)
    b = spheroidal_roots(3, len(a), vp_vs=2.0)
    np.testing.assert_allclose(a, b)
    assert toroidal_roots(7, 12).size == 12
    assert np.all(np.diff(toroidal_roots(7, 12)) > 0)


def test_const_ball_frequencies():
    modes = lamb_modes(6371.0, 10.0, 5.7735, 5.51, 2.0)
    by_name = {m.name: m for m in modes}
    for name, f in CONST_MHZ.items():
        assert by_name[name].frequency_mhz == pytest.approx(f, abs=6e-6), name
    assert [m.name for m in modes[:10]] == list(CONST_MHZ)
    assert by_name["0S2"].multiplicity == 5 and by_name["1S1"].multiplicity == 3


def test_const_ball_multiplet_count():
    # The design note says 56; two independent constructions of the spheroidal
    # determinant and the toroidal roots give 58 (23 T + 35 S), the last being 3T2
    # at 1.9863 mHz.
    modes = lamb_modes(6371.0, 10.0, 5.7735, 5.51, 2.0)
    assert len(modes) == 58
    assert sum(m.kind == "T" for m in modes) == 23
    assert modes[-1].name == "3T2"
    freqs = [m.frequency_mhz for m in modes]
    assert freqs == sorted(freqs) and freqs[-1] <= 2.0
    assert sum(m.multiplicity for m in modes) == 582


def test_independent_traction_determinant_sign_changes():
    # rebuild the traction determinant from the displacement potentials with finite
    # differences, independent of the closed form, and compare root counts per l
    r3 = math.sqrt(3.0)
    y_max = 2e-3 * 2 * math.pi * 6371.0 / 5.7735

    def det(l, y):
        kp, ks, L, h = y / r3, y, l * (l + 1.0), 1e-5

        def d(f):
            return (f(1 + h) - f(1 - h)) / (2 * h)

        def up(r):
            return kp * spherical_jn(l, kp * r, derivative=True)

        def vp(r):
            return spherical_jn(l, kp * r) / r

        def us(r):
            return L * spherical_jn(l, ks * r) / r

        def vs(r):
            return (spherical_jn(l, ks * r) + ks * r * spherical_jn(l, ks * r, True)) / r

        srr_p = (r3**2 - 2.0) * (-(kp**2) * spherical_jn(l, kp)) + 2 * d(up)
        srt_p = d(vp) - vp(1) + up(1)
        return srr_p * (d(vs) - vs(1) + us(1)) - 2 * d(us) * srt_p

    total = 0
    for l in range(1, 15):
        g = np.linspace(0.3, y_max, 8000)
        v = det(l, g)
        n = int(np.sum(np.sign(v[1:]) != np.sign(v[:-1])))
        assert n == spheroidal_roots(l, y_max=y_max).size, l
        total += n
    assert total == 33


def test_soft_bulk_modulus_low_roots_found():
    # near kappa = 0 the breathing mode and 1S1 drop to y ~ 0.1: the scan must not start
    # at a fixed fraction of the range
    assert radial_roots(1, vp_vs=1.155)[0] == pytest.approx(0.1018, abs=2e-4)
    assert spheroidal_roots(1, 1, vp_vs=1.155)[0] == pytest.approx(0.1132, abs=2e-4)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda: toroidal_roots(0, 2), "l must be"),
        (lambda: toroidal_roots(2), "n_max"),
        (lambda: spheroidal_roots(2, 2, vp_vs=1.1), "sqrt"),
        (lambda: lamb_modes(6371.0, 10.0, 0.0, 5.5, 1.0), "vs"),
        (lambda: lamb_modes(6371.0, 10.0, 5.0, 5.5, -1.0), "fmax"),
    ],
)
def test_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()
