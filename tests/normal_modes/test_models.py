"""Radial planet models: readers, interpolation at discontinuities, unit helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from furnace.normal_modes.models import (
    Mode,
    RadialModel,
    default_data_dir,
    from_mhz,
    homogeneous_ball,
    load_planet,
    read_bm,
    to_mhz,
)

HAVE_DATA = (default_data_dir() / "Mars_DWAK.bm").is_file()
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="shared planet_models data not present")


def test_mhz_round_trip():
    assert to_mhz(from_mhz(0.5062)) == pytest.approx(0.5062, rel=1e-14)
    assert to_mhz((2 * math.pi * 1e-3) ** 2) == pytest.approx(1.0)
    np.testing.assert_allclose(to_mhz(from_mhz(np.array([0.1, 2.0]))), [0.1, 2.0])
    with pytest.raises(ValueError, match="non-negative"):
        to_mhz(-1.0)


def test_mode_defaults_and_validation():
    m = Mode("S", 0, 2, 0.3)
    assert m.multiplicity == 5 and m.name == "0S2"
    with pytest.raises(ValueError, match="kind"):
        Mode("X", 0, 2, 0.3)
    with pytest.raises(ValueError, match="l >= 1"):
        Mode("T", 0, 0, 0.3)


def test_ball():
    b = homogeneous_ball()
    assert b.surface_radius == 6371.0 and b.fluid_core_radius == 0.0
    assert b.layers() == [(0.0, 6371.0, False)]
    rho, vp, vs = b.at(1234.5)
    assert (rho, vp, vs) == (5.51, 10.0, 5.7735)
    lam, mu = b.lame(100.0)
    assert mu == pytest.approx(5.51 * 5.7735**2)
    assert lam == pytest.approx(5.51 * (100 - 2 * 5.7735**2))


def _two_layer():
    return RadialModel(
        "toy",
        radius_km=[0.0, 1.0, 1.0, 3.0],
        rho=[10.0, 9.0, 5.0, 3.0],
        vp=[8.0, 8.0, 10.0, 6.0],
        vs=[0.0, 0.0, 5.0, 3.0],
    )


def test_interpolation_and_sides():
    m = _two_layer()
    assert m.at(0.5) == pytest.approx((9.5, 8.0, 0.0))
    assert m.at(1.0, side="below") == pytest.approx((9.0, 8.0, 0.0))
    assert m.at(1.0, side="above") == pytest.approx((5.0, 10.0, 5.0))
    assert m.at(2.0, side="above") == m.at(2.0, side="below")
    rho, _, vs = m.at(np.array([0.0, 2.0, 3.0]))
    # vs is 0 in the fluid: a floor at the model's speed scale, not a pure ratio against 0
    np.testing.assert_allclose(rho, [10.0, 4.0, 3.0], rtol=1e-12, atol=1e-12 * 10.0)
    np.testing.assert_allclose(vs, [0.0, 4.0, 3.0], rtol=1e-12, atol=1e-12 * 5.0)
    assert m.layers() == [(0.0, 1.0, True), (1.0, 3.0, False)]
    assert m.fluid_core_radius == 1.0
    assert m.solid_regions() == [(1.0, 3.0)]
    with pytest.raises(ValueError, match="outside"):
        m.at(3.5)
    with pytest.raises(ValueError, match="side"):
        m.at(1.0, side="left")


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(radius_km=[0.0, 2.0, 1.0]), "non-decreasing"),
        (dict(radius_km=[1.0, 2.0, 3.0]), "centre"),
        (dict(rho=[1.0, -1.0, 1.0]), "density"),
        (dict(vs=[1.0, 0.0, 1.0]), "partly fluid"),
        (dict(vp=[1.0, 1.0, 1.0]), "bulk modulus"),
        (dict(vs=[1.0, 1.0]), "values"),
    ],
)
def test_validation(kwargs, msg):
    base = dict(radius_km=[0.0, 1.0, 2.0], rho=[1.0] * 3, vp=[3.0] * 3, vs=[1.0] * 3)
    base.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        RadialModel("bad", **base)


def test_read_bm_units_and_voigt(tmp_path):
    p = tmp_path / "x.bm"
    p.write_text(
        "NAME toy\nANISOTROPIC T\nUNITS m\nCOLUMNS radius rho vpv vsv qka qmu vph vsh eta\n"
        "0. 5000. 6000. 3000. 1 1 6000. 3000. 1.0\n"
        "1000000. 4000. 6000. 3000. 1 1 7000. 3500. 0.9\n"
    )
    m = read_bm(p)
    assert m.name == "toy" and m.surface_radius == 1000.0
    assert m.at(0.0) == pytest.approx((5.0, 6.0, 3.0))
    rho, vp, vs = m.at(1000.0)
    assert rho == pytest.approx(4.0)
    # Voigt average of the anisotropic top knot lies between vsv and vsh
    assert 3.0 < vs < 3.5 and 6.0 < vp < 7.0


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_planet("mars", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown planet"):
        load_planet("venus")
    assert load_planet("ball").surface_radius == 6371.0


@needs_data
def test_mars_dwak():
    m = load_planet("mars")
    assert m.surface_radius == pytest.approx(3389.5)
    assert m.fluid_core_radius == pytest.approx(1684.781)
    assert m.at(1684.781, side="below")[2] == 0.0
    assert m.at(1684.781, side="above") == pytest.approx((4.09651, 9.69985, 5.11547))
    assert m.solid_regions()[-1] == pytest.approx((1684.781, 3389.5))


@needs_data
def test_prem_and_moon():
    prem = load_planet("prem")
    assert prem.surface_radius == 6371.0 and prem.fluid_core_radius == 3480.0
    assert prem.layers()[-1][2]  # the ocean
    assert prem.solid_regions()[-1] == (3480.0, 6368.0)
    assert prem.at(6371.0)[0] == pytest.approx(1.02)
    dry = load_planet("prem", data_dir=default_data_dir())
    assert dry.solid_regions() == prem.solid_regions()
    from furnace.normal_modes.models import read_prem_csv

    no_ocean = read_prem_csv(default_data_dir() / "PREM_1s.csv", ocean=False)
    assert no_ocean.surface_radius == 6368.0 and not no_ocean.layers()[-1][2]
    moon = load_planet("moon")
    assert moon.surface_radius == pytest.approx(1737.151)
    assert moon.fluid_core_radius == pytest.approx(330.0)
    assert moon.solid_regions() == [(0.0, 240.0), (330.0, 1737.151)]
