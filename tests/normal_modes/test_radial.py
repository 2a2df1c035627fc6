"""1-D toroidal FEM: Lamb's ball, Mars DWAK reference values, refinement."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.normal_modes.lamb import lamb_modes, toroidal_roots
from furnace.normal_modes.models import (
    RadialModel,
    default_data_dir,
    homogeneous_ball,
    load_planet,
)
from furnace.normal_modes.radial import radial_mesh, toroidal_eigenvalues, toroidal_modes

needs_data = pytest.mark.skipif(
    not (default_data_dir() / "Mars_DWAK.bm").is_file(), reason="planet_models data missing"
)

# design note section 4.2, mHz, 4 decimals
MARS_DWAK = {
    "0T2": 0.5062, "0T3": 0.7834, "0T4": 1.0283, "0T5": 1.2570, "0T6": 1.4762,
    "1T1": 1.4666, "1T2": 1.6151, "1T3": 1.8160,
}  # fmt: skip


@pytest.mark.parametrize("order", [1, 2])
def test_ball_matches_lamb(order):
    ball = homogeneous_ball()
    want = {m.name: m.frequency_mhz for m in lamb_modes(6371, 10, 5.7735, 5.51, 2.0)}
    got = toroidal_modes(ball, range(1, 12), 2.0, num_elements=1000, order=order)
    assert len(got) == sum(name[1] == "T" for name in want)
    for m in got:
        assert m.frequency_mhz == pytest.approx(want[m.name], rel=1e-4 if order == 1 else 1e-8)


@pytest.mark.parametrize("order, expected_rate", [(1, 2.0), (2, 4.0)])
def test_convergence_under_refinement(order, expected_rate):
    ball = homogeneous_ball()
    exact = (toroidal_roots(2, 3)[2] * 5.7735 / 6371.0) ** 2
    errs = []
    for ne in (20, 40, 80):
        vals = toroidal_eigenvalues(ball, 2, 3.0, ne, order=order)
        errs.append(vals[2] / exact - 1)
    errs = np.array(errs)
    assert np.all(errs > 0)  # consistent mass: from above
    rates = np.log2(errs[:-1] / errs[1:])
    # eigenvalue error goes as h^(2p) for degree-p elements
    assert np.all(rates > expected_rate - 0.3), rates


def test_l1_drops_rigid_rotation():
    ball = homogeneous_ball()
    modes = toroidal_modes(ball, [1], 2.0, 200)
    assert [m.name for m in modes] == ["1T1", "2T1", "3T1"]
    # 1T1 of a ball is the first zero of j_2
    assert modes[0].frequency_mhz == pytest.approx(5.763459 * 5.7735 / 6371 * 1e3 / (2 * np.pi))


def test_shell_over_fluid_core_equals_thin_layered_shell():
    # a solid shell over a fluid core; splitting the shell by a fake discontinuity with the
    # same material on both sides must not change anything
    a = RadialModel("a", [0, 1000, 1000, 3000], [10, 10, 4, 4], [8, 8, 9, 9], [0, 0, 5, 5])
    b = RadialModel(
        "b", [0, 1000, 1000, 2000, 2000, 3000], [10, 10, 4, 4, 4, 4], [8, 8, 9, 9, 9, 9],
        [0, 0, 5, 5, 5, 5],
    )  # fmt: skip
    fa = [m.frequency_mhz for m in toroidal_modes(a, [2, 3], 3.0, 300)]
    fb = [m.frequency_mhz for m in toroidal_modes(b, [2, 3], 3.0, 300)]
    np.testing.assert_allclose(fa, fb, rtol=1e-9)
    assert radial_mesh(b, 300)[0] == 1000.0


@needs_data
def test_mars_dwak_reference():
    modes = toroidal_modes(load_planet("mars"), range(1, 7), 1.9, num_elements=1000)
    got = {m.name: m.frequency_mhz for m in modes}
    assert set(got) == set(MARS_DWAK)
    for name, f in MARS_DWAK.items():
        assert got[name] == pytest.approx(f, abs=6e-5), name


@needs_data
def test_mars_p1_p2_agree():
    mars = load_planet("mars")
    f1 = [m.frequency_mhz for m in toroidal_modes(mars, [2, 3], 1.0, 1000, order=1)]
    f2 = [m.frequency_mhz for m in toroidal_modes(mars, [2, 3], 1.0, 1000, order=2)]
    np.testing.assert_allclose(f1, f2, rtol=1e-5)


@needs_data
def test_prem_and_moon_fundamentals():
    prem = {m.name: m.frequency_mhz for m in toroidal_modes(load_planet("prem"), [2, 3, 4], 0.8)}
    assert prem["0T2"] == pytest.approx(0.38276, abs=2e-5)
    assert prem["0T3"] == pytest.approx(0.5915, abs=6e-5)
    assert prem["0T4"] == pytest.approx(0.7726, abs=6e-5)
    moon = toroidal_modes(load_planet("moon"), [2], 1.2)
    assert moon[0].name == "0T2" and moon[0].frequency_mhz == pytest.approx(0.99459, abs=2e-5)


def test_errors():
    ball = homogeneous_ball()
    fluid = RadialModel("f", [0, 1], [1, 1], [1, 1], [0, 0])
    with pytest.raises(ValueError, match="no solid"):
        toroidal_modes(fluid, [2], 1.0)
    with pytest.raises(ValueError, match="l >= 1"):
        toroidal_modes(ball, [0, 2], 1.0)
    with pytest.raises(ValueError, match="shell index"):
        toroidal_modes(ball, [2], 1.0, shell=3)
    with pytest.raises(ValueError, match="order"):
        toroidal_modes(ball, [2], 1.0, order=3)
    with pytest.raises(ValueError, match="num_elements"):
        toroidal_modes(ball, [2], 1.0, num_elements=0)
