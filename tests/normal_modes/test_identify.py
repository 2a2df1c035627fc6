"""Tests for furnace.normal_modes.identify: T/S and degree from surface fields, multiplets."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.linalg import eigsh

from furnace.normal_modes.identify import (
    _harmonics_and_gradients,
    group_multiplets,
    identify_surface,
    real_sph_harm,
)
from furnace.runtime.testing import start_vector


def fibonacci_sphere(n):
    i = np.arange(n) + 0.5
    z = 1.0 - 2.0 * i / n
    phi = np.pi * (1.0 + 5**0.5) * i
    s = np.sqrt(1.0 - z**2)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=1)


def test_real_harmonics_are_orthonormal():
    x = fibonacci_sphere(4000)
    theta = np.arccos(x[:, 2])
    phi = np.arctan2(x[:, 1], x[:, 0])
    Y, degs = real_sph_harm(4, theta, phi)
    assert Y.shape == (4000, 25) and list(np.bincount(degs)) == [1, 3, 5, 7, 9]
    gram = Y.T @ Y * (4 * np.pi / 4000)
    np.testing.assert_allclose(gram, np.eye(25), atol=5e-3)


@pytest.mark.parametrize("l", [1, 2, 3, 5])
def test_synthetic_toroidal_and_spheroidal(l):
    rng = np.random.default_rng(l)
    x = fibonacci_sphere(400)
    Y, G, degs = _harmonics_and_gradients(8, x)
    cols = np.nonzero(degs == l)[0]
    c = rng.standard_normal(cols.size)
    grad = np.einsum("nkd,k->nd", G[:, cols], c)
    tor = -np.cross(x, grad)
    sph = 0.7 * (Y[:, cols] @ c)[:, None] * x + 0.4 * grad
    t = identify_surface(x, tor)
    s = identify_surface(x, sph)
    assert (t.kind, t.l) == ("T", l) and t.radial_fraction < 1e-12
    assert (s.kind, s.l) == ("S", l) and s.radial_fraction > 0.05
    assert t.residual < 1e-6 and s.residual < 1e-6
    assert t.toroidal_fraction > 0.999 and s.toroidal_fraction < 1e-3
    # radial breathing: degree 0, spheroidal
    b = identify_surface(x, 0.3 * x)
    assert (b.kind, b.l) == ("S", 0) and b.radial_fraction == pytest.approx(1.0)


def test_group_multiplets():
    f = np.array([2.0, 2.001, 1.999, 3.0, 3.002, 3.001, 2.998, 3.0005, 4.5])
    rng = np.random.default_rng(0)
    perm = rng.permutation(f.size)
    groups = group_multiplets(f[perm], 2e-3)
    assert [g.size for g in groups] == [3, 5, 1]
    assert sorted(perm[groups[0]].tolist()) == [0, 1, 2]
    assert group_multiplets([], 1e-3) == []
    with pytest.raises(ValueError, match="rel_tol"):
        group_multiplets(f, 0.0)
    with pytest.raises(ValueError, match="too few"):
        identify_surface(fibonacci_sphere(20), fibonacci_sphere(20), lmax=8)


@pytest.mark.timeout(180)
def test_identifies_lamb_ball_multiplets():
    pytest.importorskip("gmsh")
    pytest.importorskip("skfem")
    from furnace.normal_modes.assembly import assemble, homogeneous
    from furnace.normal_modes.identify import identify_multiplets
    from furnace.normal_modes.mesh import ball_mesh

    mesh = ball_mesh(1.0, 0.15)
    K, M, basis = assemble(mesh, homogeneous(1.0, np.sqrt(3.0), 1.0), return_basis=True)
    w, v = eigsh(K, k=36, M=M, sigma=9.0, which="LM", v0=start_vector(K))
    om = np.sqrt(np.abs(w))
    keep = (om > 2.0) & (om < 4.2)
    groups = identify_multiplets(mesh, om[keep], v[:, keep], basis, rel_tol=5e-3)
    got = [(g["kind"], g["l"], g["size"]) for g in groups]
    assert got == [("T", 2, 5), ("S", 2, 5), ("S", 1, 3), ("T", 3, 7), ("S", 3, 7)]
    for g in groups:
        assert g["complete"]
        # every member agrees, not just the majority
        assert all((m.kind, m.l) == (g["kind"], g["l"]) for m in g["ids"])
        if g["kind"] == "T":
            assert max(m.radial_fraction for m in g["ids"]) < 0.01
        else:
            assert min(m.radial_fraction for m in g["ids"]) > 0.05


def test_identify_reads_the_right_nodes_on_a_curved_p2_mesh():
    # scikit-fem renumbers the vertices of a curved order-2 mesh; identification must match
    # dofs to mesh nodes by position, or a rigid rotation comes out as noise
    pytest.importorskip("gmsh")
    pytest.importorskip("skfem")
    from furnace.normal_modes.assembly import assemble, homogeneous, point_dofs
    from furnace.normal_modes.identify import identify_mode
    from furnace.normal_modes.mesh import ball_mesh

    mesh = ball_mesh(1.0, 0.35, order=2)
    _, _, basis = assemble(mesh, homogeneous(1.0, np.sqrt(3.0), 1.0), order=2,
                           return_basis=True)
    u = np.zeros(basis.N)
    u[point_dofs(mesh, basis)] = np.cross([0.0, 0.0, 1.0], mesh.points)
    mode = identify_mode(mesh, u, basis, lmax=4)
    assert (mode.kind, mode.l) == ("T", 1) and mode.residual < 1e-6
