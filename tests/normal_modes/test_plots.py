"""Tests for furnace.normal_modes.plots: surface maps, meridional sections, mode figures.

Synthetic fields on a small homogeneous ball stand in for eigenvectors: the rigid rotation
u = e_z x x is toroidal (u_r = 0 everywhere) and u = x is radial (u_t = 0 at the surface).
"""

from __future__ import annotations

import numpy as np
import pytest

from furnace.normal_modes.assembly import assemble, homogeneous, vertex_dofs
from furnace.normal_modes.export import point_dofs
from furnace.normal_modes.mesh import ball_mesh
from furnace.normal_modes.plots import (
    meridional_section,
    mode_figure,
    section_grid,
    surface_field,
    surface_map,
)
from furnace.normal_modes.solve import compute_modes


@pytest.fixture(scope="module")
def ball():
    mesh = ball_mesh(1.0, 0.35)
    _, _, basis = assemble(mesh, homogeneous(1.0, 3**0.5, 1.0), return_basis=True)
    p = mesh.points
    dofs = vertex_dofs(basis)
    rotation = np.zeros(basis.N)
    rotation[dofs] = np.stack([-p[:, 1], p[:, 0], np.zeros(len(p))], axis=1)
    radial = np.zeros(basis.N)
    radial[dofs] = p
    return mesh, basis, rotation, radial


def test_auto_kind_tangential_for_rotation_radial_for_x(ball):
    mesh, basis, rotation, radial = ball
    rot = surface_field(mesh, basis, rotation)
    assert rot.radial_share < 1e-12 and rot.auto_kind() == "tangential"
    # the equator moves fastest: |u_t| there is the surface maximum
    assert rot.u_t[np.argmin(np.abs(rot.lat))] == pytest.approx(1.0, abs=0.05)
    rad = surface_field(mesh, basis, radial)
    assert rad.radial_share == pytest.approx(1.0) and rad.auto_kind() == "radial"
    np.testing.assert_allclose(rad.u_r, 1.0)
    assert rot.surface_share == pytest.approx(1.0) and rad.surface_share == pytest.approx(1.0)
    # |x| (1.5 - |x|) peaks at depth 0.25 with 0.5625, against 0.5 at the surface
    r = np.linalg.norm(mesh.points, axis=1)
    deep = np.zeros(basis.N)
    deep[vertex_dofs(basis)] = mesh.points * (1.5 - r)[:, None]
    assert surface_field(mesh, basis, deep).surface_share == pytest.approx(0.5 / 0.5625, rel=0.02)
    assert surface_map(mesh, basis, rotation).get_title() == "surface $|u_t|$"
    assert surface_map(mesh, basis, radial).get_title() == "surface $u_r$"
    # an explicit kind overrides the choice
    ax = surface_map(mesh, basis, rotation, kind="radial", projection="latlon", title="x")
    assert ax.get_title() == "x" and ax.get_xlim() == (-180.0, 180.0)


def test_surface_map_rejects_bad_arguments(ball):
    mesh, basis, rotation, _ = ball
    with pytest.raises(ValueError, match="kind"):
        surface_map(mesh, basis, rotation, kind="toroidal")
    with pytest.raises(ValueError, match="projection"):
        surface_map(mesh, basis, rotation, projection="robinson")
    plain = meridional_section(mesh, basis, rotation)  # rectilinear axes
    with pytest.raises(ValueError, match="mollweide"):
        surface_map(mesh, basis, rotation, ax=plain)
    with pytest.raises(ValueError, match="length"):
        surface_map(mesh, basis, rotation[:-3])


def test_section_of_radial_field_grows_with_radius(ball):
    mesh, basis, _, radial = ball
    sec = section_grid(mesh, basis, radial, n_r=30, n_theta=73)
    r = np.hypot(sec.x, sec.z)
    assert np.all(np.isfinite(sec.amplitude))
    assert np.all(np.diff(sec.amplitude.mean(axis=0)) > 0)
    # P1 reproduces a linear field exactly, and the slivers between the flat surface facets
    # and the sphere are extrapolated from the tets next to them
    np.testing.assert_allclose(sec.amplitude, r, atol=1e-10)


def test_section_on_curved_p2_mesh_uses_all_ten_nodes():
    mesh = ball_mesh(1.0, 0.4, order=2)
    _, _, basis = assemble(mesh, homogeneous(1.0, 3**0.5, 1.0), order=2, return_basis=True)
    sec = section_grid(mesh, basis, basis.project(lambda x: x), n_r=25, n_theta=61)
    r = np.hypot(sec.x, sec.z)
    # straight tets interpolate quadratically, curved ones linearly: both reproduce u = x
    np.testing.assert_allclose(sec.amplitude, r, atol=1e-10)
    # u = (xz, 0, 0) at the nodes: only the quadratic shape functions reproduce it, and the
    # tets within r < 0.4 of this mesh are straight
    p = mesh.points
    u = np.zeros(basis.N)
    u[point_dofs(mesh, basis)] = np.stack([p[:, 0] * p[:, 2], 0 * p[:, 0], 0 * p[:, 0]], axis=1)
    sec = section_grid(mesh, basis, u, n_r=25, n_theta=61)
    exact = np.abs(sec.x * sec.z) / np.abs(p[:, 0] * p[:, 2]).max()
    np.testing.assert_allclose(sec.amplitude[r < 0.4], exact[r < 0.4], atol=1e-12)
    assert np.abs(sec.amplitude - exact)[r > 0.5].max() > 1e-3  # curved tets: linear


def test_section_of_rotation_vanishes_on_the_axis(ball):
    mesh, basis, rotation, _ = ball
    sec = section_grid(mesh, basis, rotation, n_r=30, n_theta=73)
    # |e_z x x| = |x| sin(theta) on the plane y = 0
    np.testing.assert_allclose(sec.amplitude, np.abs(sec.x), atol=0.05)
    assert sec.amplitude[0].max() < 1e-10  # theta = 0 is the z axis


def test_fluid_core_circle_is_drawn_dashed(ball):
    mesh, basis, _, radial = ball
    ax = meridional_section(mesh, basis, radial, fluid_radius=0.5)
    dashed = [p for p in ax.patches if p.get_linestyle() not in ("-", "solid")]
    assert len(ax.patches) == 2 and len(dashed) == 1
    assert dashed[0].get_radius() == 0.5
    assert len(meridional_section(mesh, basis, radial).patches) == 1


def test_mode_figure_saves_png(ball, tmp_path):
    mesh, basis, rotation, _ = ball
    fig = mode_figure(mesh, basis, rotation, label="0T2", frequency_mhz=0.3796,
                      fluid_radius=0.4)
    assert len(fig.axes) == 4  # map, section and their colorbars
    assert "0T2" in fig.get_suptitle() and "0.3796 mHz" in fig.get_suptitle()
    path = tmp_path / "mode.png"
    fig.savefig(path, dpi=60)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_compute_modes_keeps_what_the_pictures_need():
    res = compute_modes("ball", 0.3, 0.37, mesh_size=0.3, identify=False)
    n = res.frequencies_mhz.size
    assert n == 5 and res.eigenvectors.shape == (res.unknowns, n) == (res.basis.N, n)
    assert res.mesh.radius == pytest.approx(6371.0)
    # 0T2 of the CONST ball: the lowest mode is toroidal
    assert surface_field(res.mesh, res.basis, res.eigenvectors[:, 0]).auto_kind() == "tangential"


def test_modes_command_writes_png_and_vtu(tmp_path, monkeypatch):
    import meshio

    from furnace.cli import main
    from furnace.normal_modes import solve

    real = solve.compute_modes

    def quick(*args, **kwargs):
        # identification costs seconds and is tested elsewhere; label the five 0T2 by hand
        res = real(*args, **{**kwargs, "identify": False})
        res.multiplets = [{"kind": "T", "l": 2, "members": np.arange(5), "size": 5,
                           "frequency": float(res.frequencies_mhz.mean()), "complete": True}]
        return res

    monkeypatch.setattr(solve, "compute_modes", quick)
    out = tmp_path / "maps"
    vtu = tmp_path / "modes.vtu"
    assert main(["modes", "--planet", "ball", "--fmin", "0.3", "--fmax", "0.37",
                 "--mesh-size", "0.3", "--plot", str(out), "--vtu", str(vtu)]) == 0
    pngs = list(out.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].name.startswith("ball_00_T2_")
    assert pngs[0].stat().st_size > 10_000
    fields = sorted(k for k in meshio.read(vtu).point_data if k.startswith("mode_"))
    assert len(fields) == 5 and all(k.startswith(f"mode_{j:03d}_T2_") for j, k in enumerate(fields))


def test_a_failed_png_leaves_no_partial_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from furnace.normal_modes.cli import write_plots
    from furnace.runtime.atomic import OutputError

    res = compute_modes("ball", 0.3, 0.37, mesh_size=0.3, identify=False)
    res.multiplets = [{"kind": "T", "l": 2, "members": np.arange(5), "size": 5,
                       "frequency": float(res.frequencies_mhz.mean()), "complete": True}]

    def broken(self, fname, **kwargs):
        fname.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(OutputError, match="disk full"):
        write_plots(res, tmp_path / "maps")
    assert list((tmp_path / "maps").iterdir()) == []
