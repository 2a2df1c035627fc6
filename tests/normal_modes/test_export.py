"""Tests for furnace.normal_modes.export: node fields and VTU files read back by meshio."""

from __future__ import annotations

import meshio
import numpy as np
import pytest

from furnace.normal_modes.assembly import assemble, homogeneous, vertex_dofs
from furnace.normal_modes.export import (
    mode_field_names,
    point_displacement,
    write_vtu,
)
from furnace.normal_modes.mesh import ball_mesh
from furnace.runtime.atomic import OutputError

UNIT = homogeneous(1.0, 3**0.5, 1.0)


@pytest.fixture(scope="module")
def ball():
    mesh = ball_mesh(1.0, 0.35)
    _, _, basis = assemble(mesh, UNIT, return_basis=True)
    p = mesh.points
    vecs = np.zeros((basis.N, 2))
    vecs[vertex_dofs(basis), 0] = np.stack([-p[:, 1], p[:, 0], np.zeros(len(p))], axis=1)
    vecs[vertex_dofs(basis), 1] = p
    return mesh, basis, vecs


def test_vtu_round_trip(ball, tmp_path):
    mesh, basis, vecs = ball
    path = write_vtu(tmp_path / "sub" / "modes.vtu", mesh, basis, vecs, [0.37961, 0.5062],
                     labels=["0T2", "0S2"])
    assert path == tmp_path / "sub" / "modes.vtu" and path.is_file()
    back = meshio.read(path)
    assert back.points.shape == mesh.points.shape
    # the centre node sits at 0: compare against the mesh's scale, not entry by entry
    scale = 1e-12 * mesh.radius
    np.testing.assert_allclose(back.points, mesh.points, rtol=0, atol=scale)
    assert back.cells[0].type == "tetra"
    np.testing.assert_array_equal(back.cells[0].data, mesh.tets)
    np.testing.assert_array_equal(back.cell_data["layer"][0], mesh.layer)
    np.testing.assert_allclose(back.point_data["radius"], np.linalg.norm(mesh.points, axis=1),
                               rtol=0, atol=scale)
    names = ["mode_000_0T2_0.3796mHz", "mode_001_0S2_0.5062mHz"]
    assert set(back.point_data) == {"radius", *names}
    for j, name in enumerate(names):
        np.testing.assert_array_equal(back.point_data[name], vecs[vertex_dofs(basis), j])


def test_single_vector_without_labels(ball, tmp_path):
    mesh, basis, vecs = ball
    back = meshio.read(write_vtu(tmp_path / "one.vtu", mesh, basis, vecs[:, 1], 0.5))
    np.testing.assert_allclose(back.point_data["mode_000_0.5000mHz"], mesh.points, rtol=0,
                               atol=1e-12 * mesh.radius)


def test_bad_shapes(ball, tmp_path):
    mesh, basis, vecs = ball
    with pytest.raises(ValueError, match="frequencies"):
        write_vtu(tmp_path / "x.vtu", mesh, basis, vecs, [0.4])
    with pytest.raises(ValueError, match="eigenvectors"):
        write_vtu(tmp_path / "x.vtu", mesh, basis, vecs[:-1], [0.4, 0.5])
    with pytest.raises(ValueError, match="labels"):
        write_vtu(tmp_path / "x.vtu", mesh, basis, vecs, [0.4, 0.5], labels=["a"])


def test_field_names_are_sanitised_and_unique():
    names = mode_field_names([0.5, 0.5, 0.6], labels=["0 T/2", "0 T/2", ""])
    assert names == ["mode_000_0_T_2_0.5000mHz", "mode_001_0_T_2_0.5000mHz", "mode_002_0.6000mHz"]
    assert mode_field_names([1.0, 1.0], labels=["a", "a"]) == [
        "mode_000_a_1.0000mHz", "mode_001_a_1.0000mHz"
    ]


def test_p2_on_curved_mesh_writes_tetra10_with_all_nodes(tmp_path):
    # scikit-fem renumbers a MeshTet2's vertices, so the node fields must be matched by
    # position; u = x projected onto P2 is exact, so every node must carry its coordinates
    mesh = ball_mesh(1.0, 0.4, order=2)
    _, _, basis = assemble(mesh, UNIT, order=2, return_basis=True)
    u = basis.project(lambda x: x)
    np.testing.assert_allclose(point_displacement(mesh, basis, u), mesh.points, atol=1e-10)
    back = meshio.read(write_vtu(tmp_path / "p2.vtu", mesh, basis, u[:, None], [0.5]))
    assert back.cells[0].type == "tetra10" and back.points.shape == mesh.points.shape
    np.testing.assert_allclose(back.point_data["mode_000_0.5000mHz"], mesh.points, atol=1e-10)


def test_p1_basis_on_other_mesh_is_rejected(ball):
    mesh, basis, vecs = ball
    other = ball_mesh(1.0, 0.5)
    with pytest.raises(ValueError, match="carry no dof"):
        point_displacement(other, basis, vecs[:, 0])


def test_plain_dof_layout_is_read_per_mesh_point(ball, tmp_path):
    # a layout like fluid_solid.SplitDofs: N and nodal_dofs in mesh order, no dof locations
    from types import SimpleNamespace

    mesh, basis, vecs = ball
    n = len(mesh.points)
    layout = SimpleNamespace(N=3 * n + 6, nodal_dofs=6 + np.arange(3 * n).reshape(n, 3).T)
    u = np.arange(layout.N, dtype=float)
    np.testing.assert_array_equal(point_displacement(mesh, layout, u)[1], [9, 10, 11])
    back = meshio.read(write_vtu(tmp_path / "s.vtu", mesh, layout, u, [0.5]))
    assert back.point_data["mode_000_0.5000mHz"].shape == (n, 3)
    with pytest.raises(ValueError, match="one column per mesh point"):
        point_displacement(mesh, SimpleNamespace(N=6, nodal_dofs=np.zeros((3, 2), int)), u[:6])


def test_failed_write_keeps_the_previous_file_and_leaves_nothing(ball, tmp_path, monkeypatch):
    mesh, basis, vecs = ball
    path = tmp_path / "modes.vtu"
    path.write_text("previous")

    def broken(filename, *args, **kwargs):
        with open(filename, "w") as f:
            f.write("<VTKFile half written")
        raise OSError("disk full")

    monkeypatch.setattr(meshio, "write", broken)
    with pytest.raises(OutputError, match="disk full"):
        write_vtu(path, mesh, basis, vecs, [0.4, 0.5])
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["modes.vtu"]
