"""The split-node fluid-solid form against closed-form energies, the scikit-fem assembly
and the 1-D toroidal truth of a shell over a fluid core."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

from furnace.runtime.testing import start_vector

pytest.importorskip("gmsh")
pytest.importorskip("skfem")

from furnace.normal_modes.assembly import assemble, homogeneous, vertex_dofs
from furnace.normal_modes.fluid_solid import assemble_split, interface_faces
from furnace.normal_modes.mesh import ball_mesh
from furnace.normal_modes.models import RadialModel, to_mhz
from furnace.normal_modes.radial import toroidal_modes

# km, g/cm^3, km/s: a solid shell (rho 4, vp 9, vs 5) on a fluid core (rho 10, vp 8)
SHELL = RadialModel("shell", [0, 1000, 1000, 3000], [10, 10, 4, 4], [8, 8, 9, 9], [0, 0, 5, 5])


def _field(layout, points, fn):
    """A continuous field fn(x) [n_vertices, 3] written into both copies of every vertex."""
    u = np.zeros(layout.N)
    vals = fn(points)
    u[layout.solid_dofs()] = vals[layout.solid_vertices]
    u[layout.fluid_dofs()] = vals[layout.fluid_vertices]
    return u


@pytest.fixture(scope="module")
def shell_mesh():
    return ball_mesh(3000.0, 900.0, (1000.0,))


def test_all_solid_ball_equals_scikit_fem_assembly():
    mesh = ball_mesh(1.0, 0.4)
    mat = homogeneous(1.3, 2.0, 1.1)
    K, M, basis = assemble(mesh, mat, return_basis=True)
    Ks, Ms, layout = assemble_split(mesh, mat)
    # same matrices up to the dof numbering
    perm = np.empty(layout.N, dtype=int)
    perm[layout.nodal_dofs.T.ravel()] = vertex_dofs(basis).ravel()
    P = sp.csr_matrix((np.ones(layout.N), (np.arange(layout.N), perm)))
    assert abs(Ks - P @ K @ P.T).max() < 1e-12 * abs(K).max()
    assert abs(Ms - P @ M @ P.T).max() < 1e-12 * abs(M).max()
    assert layout.fluid_vertices.size == 0 and layout.interface_vertices.size == 0


def test_linear_field_energy_is_exact(shell_mesh):
    # u = x: eps = I, div u = 3, so a(u, u) = (9 lam + 6 mu)|S| + 9 kappa |F| exactly, the
    # lumped pressure mass being exact for the constant pressure
    K, M, layout = assemble_split(shell_mesh, SHELL.at)
    u = _field(layout, shell_mesh.points, lambda x: x)
    p = shell_mesh.points[shell_mesh.vertex_tets]
    vol = np.abs(np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]),
                           p[:, 3] - p[:, 0])) / 6
    core = shell_mesh.layer == 0
    lam_s, mu_s = 4 * (81 - 50), 4 * 25
    kappa_f = 10 * 64
    expected = (9 * lam_s + 6 * mu_s) * vol[~core].sum() + 9 * kappa_f * vol[core].sum()
    assert u @ K @ u == pytest.approx(expected, rel=1e-10)
    # the mass is rho |u|^2 integrated (P1 exact for the quadratic |x|^2 per element)
    assert u @ M @ u > 0


def test_rigid_motions_have_zero_energy_and_interface_is_doubled(shell_mesh):
    K, _, layout = assemble_split(shell_mesh, SHELL.at)
    scale = abs(K).max() * 3000.0**2
    for axis in np.eye(3):
        for u in (_field(layout, shell_mesh.points, lambda x, a=axis: np.broadcast_to(a, x.shape)),
                  _field(layout, shell_mesh.points, lambda x, a=axis: np.cross(a, x))):
            assert np.abs(K @ u).max() < 1e-9 * scale
    faces, ftet, stet = interface_faces(shell_mesh.vertex_tets, shell_mesh.layer == 0)
    assert faces.size and np.all(shell_mesh.layer[ftet] == 0)
    assert np.all(shell_mesh.layer[stet] == 1)
    assert np.array_equal(np.unique(faces), layout.interface_vertices)
    assert layout.N == 3 * (len(shell_mesh.points) + layout.interface_vertices.size)


def test_split_fluid_toroidal_quintet_matches_the_1d_truth():
    """0T2 of a shell over a fluid core (traction-free CMB in the 1-D truth): the split form
    gives one complete T2 quintet within 1.5 %, and the core-dominated modes are set apart."""
    from furnace.normal_modes.identify import identify_multiplets, kinetic_fraction

    mesh = ball_mesh(3000.0, 600.0, (1000.0,))
    ref = [m.frequency_mhz for m in toroidal_modes(SHELL, [2], 2.0) if m.n == 0][0]
    K, M, layout = assemble(mesh, SHELL.at, lumped=True, fluid="split", return_basis=True)
    w, v = eigsh(K.tocsc(), k=30, M=M.tocsc(), sigma=(2 * np.pi * ref * 1e-3) ** 2,
                 v0=start_vector(K))
    f = np.asarray(to_mhz(np.clip(w, 0, None)))
    keep = f > 0.3 * ref  # drop the rigid and divergence-free fluid modes at 0
    core = kinetic_fraction(M, v[:, keep], layout.fluid_dofs())
    groups = identify_multiplets(mesh, f[keep], v[:, keep], layout, core_fraction=core)
    t2 = [g for g in groups if (g["kind"], g["l"]) == ("T", 2)]
    assert len(t2) == 1 and t2[0]["complete"]
    assert abs(t2[0]["frequency"] / ref - 1) < 0.015
    # toroidal motion stays out of the fluid
    assert core[t2[0]["members"]].max() < 0.05


def test_split_rejects_p2_and_unknown_fluid_kind(shell_mesh):
    with pytest.raises(ValueError, match="P1"):
        assemble(shell_mesh, SHELL.at, order=2, fluid="split")
    with pytest.raises(ValueError, match="fluid"):
        assemble(shell_mesh, SHELL.at, fluid="glued")


def test_vectorised_split_assembly_equals_the_naive_loops():
    from furnace.normal_modes.naive import naive_split_assembly

    mesh = ball_mesh(3000.0, 1200.0, (1000.0,))
    for lumped in (False, True):
        K, M, layout = assemble_split(mesh, SHELL.at, lumped=lumped)
        Kn, Mn, naive_layout = naive_split_assembly(mesh, SHELL.at, lumped=lumped)
        assert abs(K - Kn).max() <= 1e-12 * abs(Kn).max()
        assert abs(M - Mn).max() <= 1e-12 * abs(Mn).max()
        assert np.array_equal(layout.nodal_dofs, naive_layout.nodal_dofs)
        assert np.array_equal(layout.interface_vertices, naive_layout.interface_vertices)


def test_split_modes_match_dense_eigh():
    from furnace.eigen import SolverConfig, eigsh_interval
    from furnace.normal_modes.naive import naive_modes

    mesh = ball_mesh(3000.0, 1200.0, (1000.0,))
    K, M, _ = assemble_split(mesh, SHELL.at, lumped=True)
    a, b = 1e-6, 4e-5  # about 0.16-1.0 mHz: above the zero modes
    dense = naive_modes(K, M, a, b)
    fast = eigsh_interval(K, M, a, b, config=SolverConfig(a=a, b=b, mass="lumped"))
    assert dense.eigenvalues.size > 5
    # relative to the interval's end, a floor no eigenvalue in [a, b] can make zero
    np.testing.assert_allclose(fast.eigenvalues, dense.eigenvalues, rtol=1e-10, atol=1e-10 * b)
