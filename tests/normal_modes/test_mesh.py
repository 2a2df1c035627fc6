"""Tests for furnace.normal_modes.mesh: gmsh ball meshes (volume, layers, conformity)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gmsh")
pytest.importorskip("skfem")

from furnace.normal_modes.mesh import TetMesh, ball_mesh

BALL = 4.0 / 3.0 * np.pi


@pytest.mark.timeout(180)
def test_unit_ball_volume_converges():
    errs = []
    for h in (0.25, 0.15):
        m = ball_mesh(1.0, h)
        assert isinstance(m, TetMesh)
        assert m.points.shape[1] == 3 and m.tets.shape[1] == 4
        assert m.tets.dtype.kind == "i" and np.all(m.layer == 0)
        v = m.volume()
        # an inscribed polyhedron: slightly too small, never too large
        assert v < BALL
        errs.append((BALL - v) / BALL)
    assert errs[0] < 0.03 and errs[1] < 0.012
    assert errs[1] < 0.6 * errs[0]
    # every vertex lies in the closed ball and the surface vertices on the sphere
    r = np.linalg.norm(m.points, axis=1)
    assert r.max() < 1.0 + 1e-9
    np.testing.assert_allclose(r[m.boundary_nodes()], 1.0, atol=1e-9)


@pytest.mark.timeout(180)
def test_layers_are_tagged_and_conforming():
    m = ball_mesh(1.0, 0.15, interfaces=(0.5,))
    assert m.radii == (0.5, 1.0) and m.n_layers == 2
    assert set(np.unique(m.layer)) == {0, 1}
    r = np.linalg.norm(m.points, axis=1)
    rt = r[m.tets]
    assert np.all(rt[m.layer == 0] <= 0.5 + 1e-9)
    assert np.all(rt[m.layer == 1] >= 0.5 - 1e-9)

    # welded: interface vertices are corners of tets on both sides
    on_iface = np.abs(r - 0.5) < 1e-9
    assert on_iface.sum() > 50
    inner_nodes = np.unique(m.tets[m.layer == 0])
    outer_nodes = np.unique(m.tets[m.layer == 1])
    iface = np.nonzero(on_iface)[0]
    assert np.all(np.isin(iface, inner_nodes)) and np.all(np.isin(iface, outer_nodes))

    # conforming: every face is shared by two tets except the outer surface
    t = m.tets
    faces = np.sort(
        np.concatenate([t[:, [1, 2, 3]], t[:, [0, 2, 3]], t[:, [0, 1, 3]], t[:, [0, 1, 2]]]), axis=1
    )
    _, counts = np.unique(faces, axis=0, return_counts=True)
    assert counts.max() == 2
    assert np.allclose(r[m.boundary_faces()], 1.0, atol=1e-9)

    # layer volumes are close to the exact shells
    p = m.points[m.tets]
    vol = (
        np.abs(
            np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), p[:, 3] - p[:, 0])
        )
        / 6.0
    )
    v0 = vol[m.layer == 0].sum()
    v1 = vol[m.layer == 1].sum()
    assert v0 == pytest.approx(BALL / 8, rel=0.03)
    assert v1 == pytest.approx(BALL * 7 / 8, rel=0.03)


@pytest.mark.timeout(180)
def test_deterministic_and_skfem_export():
    a = ball_mesh(6371.0, 1600.0, interfaces=(3480.0,))
    b = ball_mesh(6371.0, 1600.0, interfaces=(3480.0,))
    np.testing.assert_array_equal(a.points, b.points)
    np.testing.assert_array_equal(a.tets, b.tets)
    np.testing.assert_array_equal(a.layer, b.layer)
    assert a.radius == 6371.0

    sk = a.to_skfem()
    assert sk.t.shape == (4, a.tets.shape[0]) and sk.p.shape == (3, a.points.shape[0])
    # positively oriented tets: skfem's affine maps have positive determinants
    from skfem import Basis, ElementTetP1

    basis = Basis(sk, ElementTetP1())
    assert np.all(basis.mapping.detDF(basis.X) > 0)
    assert float(basis.dx.sum()) == pytest.approx(a.volume(), rel=1e-12)


@pytest.mark.timeout(180)
def test_order2_mesh_is_curved():
    m1 = ball_mesh(1.0, 0.4)
    m2 = ball_mesh(1.0, 0.4, order=2)
    assert m2.tets.shape[1] == 10
    # mid-edge nodes of the surface lie on the sphere
    np.testing.assert_allclose(np.linalg.norm(m2.points, axis=1).max(), 1.0, atol=1e-9)
    from skfem import Basis, ElementTetP2

    sk = m2.to_skfem()
    vol2 = float(Basis(sk, ElementTetP2()).dx.sum())
    assert abs(vol2 - BALL) < 0.2 * abs(m1.volume() - BALL)


def test_bad_inputs():
    with pytest.raises(ValueError, match="radius"):
        ball_mesh(-1.0, 0.1)
    with pytest.raises(ValueError, match="mesh_size"):
        ball_mesh(1.0, 0.0)
    with pytest.raises(ValueError, match="interface"):
        ball_mesh(1.0, 0.3, interfaces=(1.2,))
    with pytest.raises(ValueError, match="order"):
        ball_mesh(1.0, 0.3, order=3)


@pytest.mark.timeout(120)
def test_p1_vector_nonzeros_per_row_priced_in_the_sc18_model():
    """furnace.eigen.sc18 prices the SC'18 runs with SC18_NNZ_A_PER_ROW, the A nonzeros
    per row of our P1 vector ball at h = 0.05: 3 (1 + 2 E / V) for V vertices, E edges."""
    from furnace.eigen.sc18 import SC18_NNZ_A_PER_ROW
    from furnace.normal_modes.assembly import assemble, homogeneous

    def per_row(mesh):
        sides = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
        pairs = np.concatenate([mesh.tets[:, [i, j]] for i, j in sides])
        edges = np.unique(np.sort(pairs, axis=1), axis=0)
        return 3.0 * (1.0 + 2.0 * len(edges) / len(mesh.points))

    coarse = ball_mesh(1.0, 0.3)
    K, M = assemble(coarse, homogeneous(1.0, 3**0.5, 1.0))
    # the formula is the assembled pattern's, and the mass has a third of it
    assert K.nnz / K.shape[0] == pytest.approx(per_row(coarse), rel=1e-12)
    assert K.nnz == 3 * M.nnz
    assert round(per_row(ball_mesh(1.0, 0.05)), 1) == SC18_NNZ_A_PER_ROW
