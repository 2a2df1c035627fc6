"""Split-node displacement-pressure form of a fluid region (NormalModes' fluid-solid coupling).

Follows the mixed formulation of Shi et al. (SC'18, section III; design note eigensolver.md
section 1.1, "Fluid core"): in a fluid (mu = 0) the pressure p = -kappa div u is a P1 field
on the fluid's vertices, and eliminating it leaves the Schur complement

    A = A_solid + E^T M_kappa^-1 E,     (M_kappa)_qr = int_F psi_q psi_r / kappa,
    E_qj = -int_F grad(psi_q) . phi_j^F + int_S psi_q n . phi_j^S,

where the second term of E is the boundary term of int_F psi div u after integrating by
parts, evaluated with the *solid* side's displacement on the fluid-solid boundary S (n the
fluid's outward normal). Vertices on S carry two displacements (6 dofs, NormalModes'
``rnum = 6``): the fluid's and the solid's. Normal continuity is enforced through the
pressure only, so the fluid slips tangentially along S and the boundary is traction-free
for toroidal motion, as the physics requires (design note section 4.2).

The one simplification against NormalModes: M_kappa is lumped (row sums, exact for the
constant part of p), so M_kappa^-1 is diagonal and A is an explicit sparse matrix that
ARPACK and the row-partitioned solver can use directly. NormalModes applies M_kappa^-1 by
a degree-25 Chebyshev iteration instead.

P1 only: each element's gradients are constant, so everything is assembled in closed form.
Divergence-free fluid motions (the null space of E on the fluid dofs) sit exactly at
lambda = 0 with the rigid-body modes, below any search interval that starts above 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .mesh import TetMesh


@dataclass
class SplitDofs:
    """The dof layout of the split-node form, shaped like a scikit-fem basis for readers.

    Solid-side vertex copies come first (3 dofs each, x/y/z interleaved), then fluid-side
    copies. `nodal_dofs` maps every mesh vertex to the copy that a surface or field plot
    should show: the solid one where a vertex has both.

    Attributes:
        N: total number of displacement dofs.
        nodal_dofs: [3, n_vertices] dof of (u_x, u_y, u_z) shown at each vertex.
        solid_vertices: mesh vertices that touch a solid tet (in dof order).
        fluid_vertices: mesh vertices that touch a fluid tet (in dof order).
        interface_vertices: vertices on the fluid-solid boundary (two copies each).
        pressure_vertices: the P1 pressure unknowns (= fluid_vertices).
    """

    N: int
    nodal_dofs: np.ndarray
    solid_vertices: np.ndarray
    fluid_vertices: np.ndarray
    interface_vertices: np.ndarray

    @property
    def pressure_vertices(self) -> np.ndarray:
        return self.fluid_vertices

    def fluid_dofs(self) -> np.ndarray:
        """[n_fluid_vertices, 3] dofs of the fluid-side copies."""
        start = 3 * self.solid_vertices.size
        return start + np.arange(3 * self.fluid_vertices.size).reshape(-1, 3)

    def solid_dofs(self) -> np.ndarray:
        """[n_solid_vertices, 3] dofs of the solid-side copies."""
        return np.arange(3 * self.solid_vertices.size).reshape(-1, 3)


def tet_geometry(points: np.ndarray, tets: np.ndarray):
    """Volumes [m] and barycentric gradients [m, 4, 3] of straight P1 tetrahedra."""
    p = points[tets[:, :4]]
    jac = np.stack([p[:, 1] - p[:, 0], p[:, 2] - p[:, 0], p[:, 3] - p[:, 0]], axis=1)
    det = np.linalg.det(jac)
    if np.any(det == 0):
        raise ValueError("degenerate (zero-volume) tetrahedra in the mesh")
    inv = np.linalg.inv(jac)  # rows of inv^T are grad(lambda_1..3)
    grads = np.empty((len(tets), 4, 3))
    grads[:, 1:] = np.transpose(inv, (0, 2, 1))
    grads[:, 0] = -grads[:, 1:].sum(axis=1)
    return np.abs(det) / 6.0, grads


def _elasticity_blocks(vol, grads, lam, mu):
    """Element stiffness [m, 12, 12] of lam div u div v + 2 mu eps(u):eps(v), dofs (a, i)."""
    gg = np.einsum("eai,ebj->eaibj", grads, grads)  # G_a,i G_b,j
    dot = np.einsum("eak,ebk->eab", grads, grads)
    eye = np.eye(3)
    k = (lam[:, None, None, None, None] * gg
         + mu[:, None, None, None, None] * (np.einsum("eab,ij->eaibj", dot, eye)
                                            + np.transpose(gg, (0, 3, 2, 1, 4))))
    return (vol[:, None, None, None, None] * k).reshape(-1, 12, 12)


def _scatter(blocks: np.ndarray, rows: np.ndarray, cols: np.ndarray, shape) -> sp.csr_matrix:
    r = np.broadcast_to(rows[:, :, None], blocks.shape).ravel()
    c = np.broadcast_to(cols[:, None, :], blocks.shape).ravel()
    return sp.csr_matrix((blocks.ravel(), (r, c)), shape=shape)


def interface_faces(tets: np.ndarray, fluid: np.ndarray):
    """Faces shared by a fluid and a solid tet: (vertices [k, 3], fluid tet [k], solid tet [k])."""
    t = tets[:, :4]
    local = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])
    faces = t[:, local].reshape(-1, 3)
    owner = np.repeat(np.arange(len(t)), 4)
    key = np.sort(faces, axis=1)
    order = np.lexsort(key.T[::-1])
    key, owner, faces = key[order], owner[order], faces[order]
    same = np.all(key[1:] == key[:-1], axis=1)
    first = np.nonzero(same)[0]
    a, b = owner[first], owner[first + 1]
    mixed = fluid[a] != fluid[b]
    a, b, verts = a[mixed], b[mixed], key[first[mixed]]
    fluid_tet = np.where(fluid[a], a, b)
    solid_tet = np.where(fluid[a], b, a)
    return verts, fluid_tet, solid_tet


def assemble_split(mesh: TetMesh, material, lumped: bool = False):
    """Stiffness and mass of the split-node form on a P1 mesh; returns (K, M, SplitDofs).

    Args:
        mesh: an order-1 `TetMesh`; fluid tets are those where the material has vs = 0.
        material: r -> (rho, vp, vs), as for `assembly.assemble`.
        lumped: row-sum lumped displacement mass.
    """
    from .assembly import element_material

    if mesh.order != 1:
        raise ValueError("the split-node fluid form is implemented for P1 (order-1 meshes)")
    mat = element_material(mesh, material)
    fluid = mat.fluid
    tets = mesh.vertex_tets
    nv = len(mesh.points)
    vol, grads = tet_geometry(mesh.points, tets)
    touches_solid = np.zeros(nv, bool)
    touches_solid[tets[~fluid].ravel()] = True
    touches_fluid = np.zeros(nv, bool)
    touches_fluid[tets[fluid].ravel()] = True
    solid_v = np.nonzero(touches_solid)[0]
    fluid_v = np.nonzero(touches_fluid)[0]
    solid_index = np.full(nv, -1)
    solid_index[solid_v] = np.arange(solid_v.size)
    fluid_index = np.full(nv, -1)
    fluid_index[fluid_v] = solid_v.size + np.arange(fluid_v.size)
    n = 3 * (solid_v.size + fluid_v.size)
    # which copy each tet's corners use: its own side's
    copy = np.where(fluid[:, None], fluid_index[tets], solid_index[tets])
    dofs = (3 * copy[:, :, None] + np.arange(3)).reshape(-1, 12)

    solid = ~fluid
    K = _scatter(_elasticity_blocks(vol[solid], grads[solid], mat.lam[solid], mat.mu[solid]),
                 dofs[solid], dofs[solid], (n, n))
    # P1 mass: rho vol / 20 (1 + delta_ab) per component
    ref = (np.ones((4, 4)) + np.eye(4)) / 20.0
    mass_blocks = np.einsum("e,ab,ij->eaibj", mat.rho * vol, ref, np.eye(3)).reshape(-1, 12, 12)
    M = _scatter(mass_blocks, dofs, dofs, (n, n))

    if np.any(fluid):
        kappa = mat.lam[fluid] + 2.0 * mat.mu[fluid] / 3.0
        p_index = np.full(nv, -1)
        p_index[fluid_v] = np.arange(fluid_v.size)
        ftets = tets[fluid]
        prow = p_index[ftets]  # [mf, 4]
        # -int grad(psi_a) . phi_(b, i) = -G_a,i vol / 4 for every corner b
        vol_f, grads_f = vol[fluid], grads[fluid]
        e_vol = -np.einsum("e,eai,b->eabi", vol_f / 4.0, grads_f, np.ones(4)).reshape(-1, 4, 12)
        E = _scatter(e_vol, prow, dofs[fluid], (fluid_v.size, n))
        verts, ftet, stet = interface_faces(tets, fluid)
        if verts.size:
            p = mesh.points
            normal = 0.5 * np.cross(p[verts[:, 1]] - p[verts[:, 0]],
                                    p[verts[:, 2]] - p[verts[:, 0]])  # area-weighted
            centre_f = p[tets[ftet]].mean(axis=1)
            outward = np.einsum("ij,ij->i", normal, p[verts].mean(axis=1) - centre_f) > 0
            normal[~outward] *= -1.0
            # int_face psi_a phi_b = area (1 + delta_ab) / 12; normal carries the area
            tri = (np.ones((3, 3)) + np.eye(3)) / 12.0
            blocks = np.einsum("ab,ei->eabi", tri, normal).reshape(-1, 3, 9)
            sdofs = (3 * solid_index[verts][:, :, None] + np.arange(3)).reshape(-1, 9)
            E = E + _scatter(blocks, p_index[verts], sdofs, (fluid_v.size, n))
        # lumped pressure mass: int psi_q / kappa
        m_kappa = np.zeros(fluid_v.size)
        np.add.at(m_kappa, prow.ravel(), np.repeat(vol_f / 4.0 / kappa, 4))
        K = K + (E.T @ sp.diags(1.0 / m_kappa) @ E)
    K = ((K + K.T) * 0.5).tocsr()
    M = ((M + M.T) * 0.5).tocsr()
    K.sum_duplicates()
    if lumped:
        M = sp.diags(np.asarray(M.sum(axis=1)).ravel()).tocsr()
    shown = np.where(solid_index >= 0, solid_index, fluid_index)
    nodal = (3 * shown[None, :] + np.arange(3)[:, None])
    layout = SplitDofs(N=n, nodal_dofs=nodal, solid_vertices=solid_v, fluid_vertices=fluid_v,
                       interface_vertices=np.intersect1d(solid_v, fluid_v))
    return K, M, layout
