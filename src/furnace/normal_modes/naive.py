"""Slow, obviously correct references for the normal-mode pipeline.

- `naive_split_assembly`: the split-node fluid-solid matrices of `fluid_solid.assemble_split`
  (Shi et al., SC'18, section III; design note eigensolver.md 1.1), built one tetrahedron and
  one interface triangle at a time with explicit loops over corners and components, and the
  pressure Schur complement formed densely. For meshes of a few hundred vertices.
- `naive_modes`: every eigenpair of the assembled pencil in [a, b] by dense `eigh`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .mesh import TetMesh


def _gradients(p: np.ndarray):
    """Volume and barycentric gradients of one straight tet with corners p [4, 3]."""
    jac = np.array([p[1] - p[0], p[2] - p[0], p[3] - p[0]])
    inv = np.linalg.inv(jac)
    grads = np.zeros((4, 3))
    for a in range(1, 4):
        grads[a] = inv[:, a - 1]
    grads[0] = -(grads[1] + grads[2] + grads[3])
    return abs(np.linalg.det(jac)) / 6.0, grads


def naive_split_assembly(mesh: TetMesh, material, lumped: bool = False):
    """(K, M, SplitDofs) of the split-node form, element by element (see module docstring)."""
    from .assembly import element_material
    from .fluid_solid import SplitDofs

    mat = element_material(mesh, material)
    tets = mesh.vertex_tets
    nv = len(mesh.points)
    solid_v = sorted({int(v) for t, f in zip(tets, mat.fluid) if not f for v in t})
    fluid_v = sorted({int(v) for t, f in zip(tets, mat.fluid) if f for v in t})
    solid_copy = {v: i for i, v in enumerate(solid_v)}
    fluid_copy = {v: len(solid_v) + i for i, v in enumerate(fluid_v)}
    pressure = {v: i for i, v in enumerate(fluid_v)}
    n = 3 * (len(solid_v) + len(fluid_v))
    K = np.zeros((n, n))
    M = np.zeros((n, n))
    E = np.zeros((len(fluid_v), n))
    m_kappa = np.zeros(len(fluid_v))

    for e, t in enumerate(tets):
        vol, g = _gradients(mesh.points[t])
        copy = fluid_copy if mat.fluid[e] else solid_copy
        dof = [[3 * copy[int(v)] + i for i in range(3)] for v in t]
        for a in range(4):
            for b in range(4):
                for i in range(3):
                    M[dof[a][i], dof[b][i]] += mat.rho[e] * vol * (2.0 if a == b else 1.0) / 20.0
                    for j in range(3):
                        if mat.fluid[e]:
                            continue
                        # lam div u div v + 2 mu eps:eps for u = phi_a e_i, v = phi_b e_j
                        k = mat.lam[e] * g[a, i] * g[b, j]
                        k += mat.mu[e] * ((g[a] @ g[b]) * (i == j) + g[a, j] * g[b, i])
                        K[dof[a][i], dof[b][j]] += vol * k
        if mat.fluid[e]:
            kappa = mat.lam[e] + 2.0 * mat.mu[e] / 3.0
            for a in range(4):
                q = pressure[int(t[a])]
                m_kappa[q] += vol / 4.0 / kappa
                for b in range(4):
                    for i in range(3):
                        # -int grad(psi_a) . phi_b e_i = -g[a, i] vol / 4
                        E[q, dof[b][i]] -= g[a, i] * vol / 4.0

    # interface triangles: faces of a fluid tet that are also faces of a solid tet
    owners: dict[tuple, list[int]] = {}
    for e, t in enumerate(tets):
        for skip in range(4):
            face = tuple(sorted(int(v) for k, v in enumerate(t) if k != skip))
            owners.setdefault(face, []).append(e)
    for face, es in owners.items():
        if len(es) != 2 or mat.fluid[es[0]] == mat.fluid[es[1]]:
            continue
        fluid_tet = es[0] if mat.fluid[es[0]] else es[1]
        p = mesh.points[list(face)]
        normal = 0.5 * np.cross(p[1] - p[0], p[2] - p[0])
        if normal @ (p.mean(axis=0) - mesh.points[tets[fluid_tet]].mean(axis=0)) < 0:
            normal = -normal  # out of the fluid
        for a in range(3):
            for b in range(3):
                for i in range(3):
                    # int_face psi_a n_i phi_b = |n| (1 + delta_ab) / 12 * unit n_i
                    E[pressure[face[a]], 3 * solid_copy[face[b]] + i] += \
                        normal[i] * (2.0 if a == b else 1.0) / 12.0

    if fluid_v:
        K += E.T @ np.diag(1.0 / m_kappa) @ E
    if lumped:
        M = np.diag(M.sum(axis=1))
    shown = np.array([solid_copy.get(v, fluid_copy.get(v, -1)) for v in range(nv)])
    layout = SplitDofs(N=n, nodal_dofs=3 * shown[None, :] + np.arange(3)[:, None],
                       solid_vertices=np.array(solid_v, dtype=int),
                       fluid_vertices=np.array(fluid_v, dtype=int),
                       interface_vertices=np.intersect1d(solid_v, fluid_v))
    return sp.csr_matrix(K), sp.csr_matrix(M), layout


def naive_modes(K, M, a: float, b: float):
    """All eigenpairs of K x = lambda M x with lambda in [a, b], by dense `eigh`."""
    from furnace.eigen import naive_eigsh_interval

    return naive_eigsh_interval(K, M, a, b)
