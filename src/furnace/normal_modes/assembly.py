"""Finite-element stiffness and mass matrices for non-gravitating elastic normal modes.

Implements the JOB=1 (no gravity) weak form of NormalModes (Shi et al., SC'18; design note
eigensolver.md section 1.1): find (lambda, u) with a(u, v) = lambda m(u, v) for all v, where

    a(u, v) = int lambda_L div(u) div(v) + 2 mu eps(u):eps(v) dx,   m(u, v) = int rho u.v dx,
    lambda_L = rho (vp^2 - 2 vs^2),   mu = rho vs^2,

discretised with continuous P1 or P2 vector Lagrange elements on tetrahedra (scikit-fem).
Material is constant per element, evaluated at the element centroid, as NormalModes does
with its element-averaged density. In km, g/cm^3 and km/s the eigenvalues are omega^2 in
s^-2, so f[mHz] = 1e3 sqrt(lambda) / (2 pi).

Fluid layers (vs = 0) come in two forms. fluid="welded" (the simplification) sets mu = 0
there and lets the fluid share its interface nodes with the solid, so tangential slip at
a fluid-solid boundary is suppressed. That drags core mass along with toroidal motion of
the mantle (the toroidal 1-D truth exposes it) and, with P1, locks the fluid (div u = 0 per
element). fluid="split" is NormalModes' form: interface nodes carry a fluid and a solid
displacement (6 dofs) and the fluid enters through a P1 pressure Schur complement; see
`fluid_solid.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .mesh import TetMesh

# r (an array, or one float for a scalar-only callable) -> (rho, vp, vs)
Material = Callable[[np.ndarray | float], tuple]


@dataclass
class ElementMaterial:
    """Per-element material: density rho, Lame lambda_L and shear modulus mu."""

    rho: np.ndarray
    lam: np.ndarray
    mu: np.ndarray

    @property
    def fluid(self) -> np.ndarray:
        return self.mu == 0.0


def homogeneous(rho: float, vp: float, vs: float) -> Material:
    """A constant material callable, e.g. homogeneous(5.51, 10.0, 5.7735) for CONST."""

    def material(r):
        r = np.asarray(r, dtype=float)
        return np.full_like(r, rho), np.full_like(r, vp), np.full_like(r, vs)

    return material


def element_material(mesh: TetMesh, material: Material) -> ElementMaterial:
    """Evaluate material(r) -> (rho, vp, vs) at the tet centroids.

    The radius is clamped into the tet's own layer, so that a material with a jump at an
    interface is sampled on the correct side even where a flat facet cuts the sphere.
    """
    p = mesh.points[mesh.vertex_tets]
    r = np.linalg.norm(p.mean(axis=1), axis=1)
    bounds = mesh.layer_bounds()[mesh.layer]
    eps = 1e-9 * mesh.radius
    r = np.clip(r, bounds[:, 0] + eps, bounds[:, 1] - eps)
    rho, vp, vs = _evaluate(material, r)
    if np.any(~np.isfinite(rho)) or np.any(~np.isfinite(vp)) or np.any(~np.isfinite(vs)):
        raise ValueError("material returned non-finite values")
    if np.any(rho <= 0):
        raise ValueError(f"material density must be positive, min is {rho.min()}")
    if np.any(vs < 0) or np.any(vp <= 0):
        raise ValueError("material wave speeds must satisfy vp > 0 and vs >= 0")
    lam = rho * (vp**2 - 2.0 * vs**2)
    if np.any(3.0 * lam + 2.0 * rho * vs**2 <= 0):
        raise ValueError("material has a non-positive bulk modulus (vp^2 <= 4/3 vs^2)")
    return ElementMaterial(rho=rho, lam=lam, mu=rho * vs**2)


def _evaluate(material: Material, r: np.ndarray):
    # accept both vectorised and scalar-only callables
    try:
        out = material(r)
        rho, vp, vs = (np.broadcast_to(np.asarray(a, dtype=float), r.shape) for a in out)
    except (TypeError, ValueError):
        vals = np.array([[float(x) for x in material(float(ri))] for ri in r])
        rho, vp, vs = vals[:, 0], vals[:, 1], vals[:, 2]
    return rho.copy(), vp.copy(), vs.copy()


def vector_basis(mesh: TetMesh, order: int = 1):
    """The scikit-fem basis for the displacement (3 components, P1 or P2).

    For an order-2 (curved, 10-node) TetMesh the P2 basis is isoparametric.
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    if mesh.order == 2 and order == 1:
        raise ValueError("P1 on a curved order-2 mesh is not supported; use order=2")
    from skfem import Basis, ElementTetP1, ElementTetP2, ElementVector
    from skfem.quadrature import get_quadrature

    elem = ElementVector(ElementTetP1() if order == 1 else ElementTetP2())
    skmesh = mesh.to_skfem()
    # exact for the P2 mass (degree 4); curved P2 geometry is then integrated approximately
    intorder = 2 * order if mesh.order == 1 else 2 * order + 2
    return Basis(skmesh, elem, quadrature=get_quadrature(skmesh.elem.refdom, intorder))


def vertex_dofs(basis) -> np.ndarray:
    """[n_vertices, 3] global dof index of (u_x, u_y, u_z) at each vertex, in the basis's own
    vertex order (which is mesh.points' order for order-1 meshes only; see point_dofs)."""
    return np.ascontiguousarray(basis.nodal_dofs.T)


def point_dofs(mesh: TetMesh, basis) -> np.ndarray:
    """[n_points, 3] global dof of (u_x, u_y, u_z) at every node of `mesh`.

    scikit-fem renumbers the vertices of a curved (MeshTet2) mesh, so the basis's vertex
    order is not mesh.points' order; the nodes are therefore matched by their coordinates
    with the basis's dof locations (vertex and edge dofs), which holds for P1 and P2 alike.
    A dof layout without dof locations (such as fluid_solid.SplitDofs, which has N and
    nodal_dofs like a basis) must give nodal_dofs per mesh point, in mesh order.
    """
    if not hasattr(basis, "doflocs"):
        nodal = np.asarray(basis.nodal_dofs)
        if nodal.shape != (3, len(mesh.points)):
            raise ValueError(
                f"dof layout has nodal_dofs of shape {nodal.shape}; expected (3, "
                f"{len(mesh.points)}), one column per mesh point"
            )
        return np.ascontiguousarray(nodal.T)
    candidates = (basis.nodal_dofs, basis.edge_dofs, basis.facet_dofs)
    groups = [d for d in candidates if d.size and d.shape[0] == 3]
    if not groups:
        raise ValueError("basis has no 3-component nodal dofs; expected a vector P1/P2 basis")
    dofs = np.concatenate(groups, axis=1)  # row c holds the u_c dofs, one column per node
    from scipy.spatial import cKDTree

    dist, idx = cKDTree(basis.doflocs[:, dofs[0]].T).query(mesh.points)
    scale = max(float(np.abs(mesh.points).max()), 1.0)
    if dist.max() > 1e-9 * scale:
        bad = int(np.count_nonzero(dist > 1e-9 * scale))
        raise ValueError(
            f"{bad} mesh nodes carry no dof of the basis (is it a basis on this mesh, and "
            "a P1 basis on an order-1 mesh or a P2 basis?)"
        )
    return np.ascontiguousarray(dofs[:, idx].T)


def assemble(
    mesh: TetMesh,
    material: Material,
    order: int = 1,
    lumped: bool = False,
    *,
    return_basis: bool = False,
    fluid: str = "welded",
):
    """Stiffness K and mass M (scipy CSR) for the non-gravitating elastic problem.

    lumped=True returns a diagonal row-sum mass, valid for P1 only: for P2 the row sums
    at the vertices are zero or negative, so the lumped matrix would not be SPD.
    With return_basis=True the scikit-fem basis is returned as a third item (it fixes the
    dof layout; see vertex_dofs). fluid="split" (P1 only) uses the split-node
    displacement-pressure form for vs = 0 elements; its third item is then a
    `fluid_solid.SplitDofs`, which has the `N` and `nodal_dofs` of a basis.
    """
    if fluid not in ("welded", "split"):
        raise ValueError(f"fluid must be 'welded' or 'split', got {fluid!r}")
    if fluid == "split":
        if order != 1:
            raise ValueError("fluid='split' is implemented for P1 only; use fluid='welded' for P2")
        from .fluid_solid import assemble_split

        K, M, layout = assemble_split(mesh, material, lumped=lumped)
        return (K, M, layout) if return_basis else (K, M)
    if lumped and order != 1:
        raise ValueError("row-sum mass lumping is only valid for P1; P2 gives non-positive masses")
    from skfem import BilinearForm
    from skfem.helpers import ddot, div, dot, sym_grad

    basis = vector_basis(mesh, order)
    mat = element_material(mesh, material)
    nqp = basis.X.shape[1]

    def per_qp(a):
        return np.repeat(a[:, None], nqp, axis=1)

    @BilinearForm
    def stiffness(u, v, w):
        return w.lam * div(u) * div(v) + 2.0 * w.mu * ddot(sym_grad(u), sym_grad(v))

    @BilinearForm
    def mass(u, v, w):
        return w.rho * dot(u, v)

    K = stiffness.assemble(basis, lam=per_qp(mat.lam), mu=per_qp(mat.mu)).tocsr()
    M = mass.assemble(basis, rho=per_qp(mat.rho)).tocsr()
    # symmetrise away the round-off of the quadrature sums
    K = ((K + K.T) * 0.5).tocsr()
    M = ((M + M.T) * 0.5).tocsr()
    if lumped:
        M = sp.diags(np.asarray(M.sum(axis=1)).ravel()).tocsr()
    if return_basis:
        return K, M, basis
    return K, M


def total_mass(mesh: TetMesh, material: Material) -> float:
    """Mass of the polyhedral mesh with element-constant density (what M integrates)."""
    p = mesh.points[mesh.vertex_tets]
    vol = (
        np.abs(
            np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), p[:, 3] - p[:, 0])
        )
        / 6.0
    )
    return float((element_material(mesh, material).rho * vol).sum())


def frequencies_mhz(eigenvalues: np.ndarray) -> np.ndarray:
    """Eigenvalues lambda = omega^2 [s^-2] to frequencies in mHz."""
    lam = np.asarray(eigenvalues, dtype=float)
    return 1e3 * np.sqrt(np.clip(lam, 0.0, None)) / (2.0 * np.pi)
