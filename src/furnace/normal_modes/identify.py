"""Mode identification for 3-D normal-mode eigenvectors: type (toroidal T or spheroidal S),
angular degree l, and grouping of eigenfrequencies into (2l+1)-fold multiplets.

The surface displacement of a spherically symmetric planet's mode is a single-degree
vector spherical harmonic field (Dahlen & Tromp 1998, ch. 8):

    u = U Y_lm r^ + V grad_1 Y_lm + W (-r^ x grad_1 Y_lm)      (summed over m in a multiplet)

with W = 0 for spheroidal modes and U = V = 0 for toroidal ones. We sample u at the
boundary vertices of the mesh and fit the three families with real, orthonormal Y_lm up to
lmax (area-weighted least squares). Energies |U|^2, l(l+1)|V|^2, l(l+1)|W|^2 then give the
radial fraction, the toroidal (curl) fraction versus the spheroidal (radial + divergence)
fraction, and the dominant degree. This follows the vector-spherical-harmonic projection
of NMPostProcess (harrymd), the identification tool referenced by NormalModes (Shi et al.,
SC'18).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .mesh import TetMesh


@dataclass
class ModeId:
    """Identification of one eigenvector.

    kind: "T" or "S"; l: dominant angular degree; radial_fraction: share of surface
    kinetic energy in u_r; toroidal_fraction: share in the curl (W) family; degree_energy:
    energy per degree for the chosen kind, index l = 0..lmax; residual: relative misfit of
    the harmonic fit (large means lmax is too small or the field is not resolved).
    """

    kind: str
    l: int
    radial_fraction: float
    toroidal_fraction: float
    degree_energy: np.ndarray
    residual: float

    @property
    def label(self) -> str:
        return f"{self.kind}{self.l}"


def real_sph_harm(lmax: int, theta: np.ndarray, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal real spherical harmonics [n_points, (lmax+1)^2] and the degree of each
    column. theta is colatitude, phi longitude."""
    from scipy import special

    cols, degs = [], []
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            y = _sph_harm_complex(special, l, abs(m), theta, phi)
            if m == 0:
                cols.append(y.real)
            elif m > 0:
                cols.append(np.sqrt(2.0) * (-1) ** m * y.real)
            else:
                cols.append(np.sqrt(2.0) * (-1) ** m * y.imag)
            degs.append(l)
    return np.stack(cols, axis=1), np.asarray(degs)


def _sph_harm_complex(special, l, m, theta, phi):
    if hasattr(special, "sph_harm_y"):
        return special.sph_harm_y(l, m, theta, phi)
    # SciPy < 1.15: sph_harm(m, n, azimuth, polar)
    return special.sph_harm(m, l, phi, theta)


def _harmonics_and_gradients(lmax: int, xhat: np.ndarray, step: float = 1e-6):
    """Y [n, k], surface gradients grad_1 Y [n, k, 3] and degrees [k] at unit vectors xhat.

    Y(x/|x|) is homogeneous of degree 0, so its Cartesian gradient at |x| = 1 is exactly
    the surface gradient; central differences give it to ~1e-10 without hand derivatives.
    """

    def ev(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        theta = np.arccos(np.clip(x[:, 2], -1.0, 1.0))
        phi = np.arctan2(x[:, 1], x[:, 0])
        return real_sph_harm(lmax, theta, phi)

    Y, degs = ev(xhat)
    grads = np.empty((*Y.shape, 3))
    for d in range(3):
        e = np.zeros(3)
        e[d] = step
        grads[:, :, d] = (ev(xhat + e)[0] - ev(xhat - e)[0]) / (2 * step)
    return Y, grads, degs


def surface_weights(mesh: TetMesh) -> tuple[np.ndarray, np.ndarray]:
    """Boundary vertex indices and their lumped surface areas (1/3 of adjacent triangles)."""
    faces = mesh.boundary_faces()
    p = mesh.points
    area = 0.5 * np.linalg.norm(
        np.cross(p[faces[:, 1]] - p[faces[:, 0]], p[faces[:, 2]] - p[faces[:, 0]]), axis=1
    )
    w = np.zeros(len(p))
    np.add.at(w, faces.ravel(), np.repeat(area / 3.0, 3))
    nodes = np.unique(faces)
    return nodes, w[nodes]


def surface_displacement(mesh: TetMesh, u: np.ndarray, basis) -> tuple[np.ndarray, np.ndarray]:
    """Surface vertex positions [nb, 3] and displacement [nb, 3] from an eigenvector u in
    the dof layout of `basis` (from assembly.assemble(..., return_basis=True))."""
    u = np.asarray(u)
    if u.ndim != 1 or u.shape[0] != basis.N:
        raise ValueError(f"eigenvector must be a vector of length {basis.N}, got {u.shape}")
    from .assembly import point_dofs

    nodes, _ = surface_weights(mesh)
    return mesh.points[nodes], u[point_dofs(mesh, basis)[nodes]]


@dataclass
class SurfaceFit:
    """Precomputed vector-spherical-harmonic least-squares fit on fixed surface points.

    Build once per mesh (the harmonics are the expensive part) and call identify() per
    eigenvector.
    """

    rhat: np.ndarray
    sw: np.ndarray
    degs: np.ndarray
    radial_basis: np.ndarray
    tangential_basis: np.ndarray
    lmax: int
    radial_pinv: np.ndarray
    tangential_pinv: np.ndarray
    nodes: np.ndarray | None = None

    @classmethod
    def build(cls, xyz: np.ndarray, weights: np.ndarray | None = None, lmax: int = 8):
        xyz = np.asarray(xyz, dtype=float)
        if xyz.ndim != 2 or xyz.shape[1] != 3:
            raise ValueError(f"xyz must be [n, 3], got {xyz.shape}")
        if lmax < 1:
            raise ValueError(f"lmax must be >= 1, got {lmax}")
        n = xyz.shape[0]
        k = (lmax + 1) ** 2
        # unknowns: k radial + 2(k-1) tangential (no l=0 tangential field); ask for margin
        if 3 * n < 2 * (3 * k - 2):
            raise ValueError(
                f"{n} surface points are too few to fit harmonics up to lmax={lmax}; "
                "refine the mesh or lower lmax"
            )
        w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (n,) or np.any(w <= 0):
            raise ValueError("weights must be positive, one per surface point")
        rhat = xyz / np.linalg.norm(xyz, axis=1, keepdims=True)
        Y, G, degs = _harmonics_and_gradients(lmax, rhat)
        C = -np.cross(rhat[:, None, :], G)  # -r^ x grad_1 Y: the toroidal family
        tang = np.concatenate([G[:, 1:, :], C[:, 1:, :]], axis=1)  # l = 0 has no tangent
        sw = np.sqrt(w)
        # weighted least squares via pseudo-inverses formed once, so each eigenvector
        # costs two matrix-vector products
        A_t = (tang * sw[:, None, None]).transpose(0, 2, 1).reshape(3 * n, -1)
        return cls(
            rhat, sw, degs, Y, tang, lmax, np.linalg.pinv(Y * sw[:, None]), np.linalg.pinv(A_t)
        )

    def identify(self, disp: np.ndarray) -> ModeId:
        disp = np.real(np.asarray(disp))
        n = self.rhat.shape[0]
        if disp.shape != (n, 3):
            raise ValueError(f"disp must be [{n}, 3], got {disp.shape}")
        sw, rhat, Y, tang = self.sw, self.rhat, self.radial_basis, self.tangential_basis
        ur = np.einsum("ij,ij->i", disp, rhat)
        ut = disp - ur[:, None] * rhat
        total = float(np.sum(sw**2 * np.einsum("ij,ij->i", disp, disp)))
        if total == 0:
            raise ValueError("displacement is zero on the surface")
        # the radial and tangential fits decouple because the families are pointwise
        # orthogonal (Y r^ is normal, grad_1 Y and r^ x grad_1 Y are tangent)
        a_r = self.radial_pinv @ (ur * sw)
        a_t = self.tangential_pinv @ (ut * sw[:, None]).reshape(-1)
        kt = Y.shape[1] - 1
        a_v, a_w = a_t[:kt], a_t[kt:]

        degs, lmax = self.degs, self.lmax
        L = (degs * (degs + 1)).astype(float)
        e_s_deg = np.bincount(degs, weights=a_r**2, minlength=lmax + 1)
        e_s_deg += np.bincount(degs[1:], weights=L[1:] * a_v**2, minlength=lmax + 1)
        e_t_deg = np.bincount(degs[1:], weights=L[1:] * a_w**2, minlength=lmax + 1)
        e_tot = e_s_deg.sum() + e_t_deg.sum()

        fit = (Y @ a_r)[:, None] * rhat + np.einsum("nkd,k->nd", tang, a_t)
        resid = float(np.sqrt(np.sum(sw**2 * np.sum((fit - disp) ** 2, axis=1)) / total))
        tor_frac = float(e_t_deg.sum() / e_tot)
        kind = "T" if tor_frac > 0.5 else "S"
        deg_e = e_t_deg if kind == "T" else e_s_deg
        return ModeId(
            kind=kind,
            l=int(np.argmax(deg_e)),
            radial_fraction=float(np.sum(sw**2 * ur**2) / total),
            toroidal_fraction=tor_frac,
            degree_energy=deg_e,
            residual=resid,
        )


def identify_surface(
    xyz: np.ndarray, disp: np.ndarray, weights: np.ndarray | None = None, lmax: int = 8
) -> ModeId:
    """Identify a mode from surface samples xyz [n, 3] and displacement disp [n, 3]."""
    xyz = np.asarray(xyz, dtype=float)
    if np.shape(disp) != xyz.shape:
        raise ValueError(f"xyz and disp shapes differ: {xyz.shape} vs {np.shape(disp)}")
    return SurfaceFit.build(xyz, weights, lmax).identify(disp)


def surface_fit(mesh: TetMesh, lmax: int = 8) -> tuple[np.ndarray, SurfaceFit]:
    """Boundary vertex indices of `mesh` and the SurfaceFit on them (area-weighted)."""
    nodes, w = surface_weights(mesh)
    fit = SurfaceFit.build(mesh.points[nodes], w, lmax)
    fit.nodes = nodes
    return nodes, fit


def identify_mode(
    mesh: TetMesh, u: np.ndarray, basis, lmax: int = 8, *, fit: SurfaceFit | None = None,
    surface_dofs: np.ndarray | None = None,
) -> ModeId:
    """Identify the eigenvector u (dof layout of `basis`) on the surface of `mesh`.

    Pass fit (from surface_fit(mesh)[1]) and surface_dofs (point_dofs(mesh, basis)[fit.nodes])
    when identifying many vectors of one mesh.
    """
    u = np.asarray(u)
    if u.ndim != 1 or u.shape[0] != basis.N:
        raise ValueError(f"eigenvector must be a vector of length {basis.N}, got {u.shape}")
    if fit is None or fit.nodes is None:
        fit = surface_fit(mesh, lmax)[1]
    if surface_dofs is None:
        from .assembly import point_dofs

        surface_dofs = point_dofs(mesh, basis)[fit.nodes]
    return fit.identify(u[surface_dofs])


def group_multiplets(frequencies, rel_tol: float = 5e-3) -> list[np.ndarray]:
    """Group frequencies into multiplets: sorted neighbours closer than rel_tol (relative
    to their mean) belong together. Returns index arrays into `frequencies`, ascending.

    Mesh asymmetry splits a degenerate (2l+1)-fold multiplet by ~1e-3 relative, while
    neighbouring multiplets are typically several percent apart.
    """
    f = np.asarray(frequencies, dtype=float).ravel()
    if rel_tol <= 0:
        raise ValueError(f"rel_tol must be positive, got {rel_tol}")
    if f.size == 0:
        return []
    if not np.all(np.isfinite(f)):
        raise ValueError("frequencies must be finite")
    order = np.argsort(f, kind="stable")
    fs = f[order]
    scale = np.maximum(np.abs(0.5 * (fs[1:] + fs[:-1])), np.finfo(float).tiny)
    breaks = np.nonzero(np.diff(fs) / scale > rel_tol)[0] + 1
    return [order[g] for g in np.split(np.arange(fs.size), breaks)]


def kinetic_fraction(mass, vectors: np.ndarray, dofs: np.ndarray) -> np.ndarray:
    """Share of each mode's kinetic energy u^T M u carried by `dofs` (e.g. the fluid core's).

    Uses the diagonal of M (exact for a lumped mass, a close estimate for a consistent one).
    """
    diag = np.asarray(mass.diagonal(), dtype=float)
    weighted = diag[:, None] * vectors**2
    total = weighted.sum(axis=0)
    return weighted[np.asarray(dofs).ravel()].sum(axis=0) / np.where(total > 0, total, 1.0)


def identify_multiplets(
    mesh: TetMesh, frequencies, vectors: np.ndarray, basis, rel_tol: float = 5e-3, lmax: int = 8,
    *, core_fraction: np.ndarray | None = None, core_threshold: float = 0.5,
) -> list[dict]:
    """Label every mode from its surface displacement, then group equal labels into multiplets.

    vectors is [n_dofs, n_modes] (as returned by eigsh). Modes whose `core_fraction` (share
    of kinetic energy in the fluid core, see `kinetic_fraction`) exceeds `core_threshold`
    are labelled kind "C", l = -1: their surface expression is too weak to name them, and
    in the non-gravitating P1 fluid many of them are discretisation artefacts. Modes with the
    same label whose sorted frequencies are closer than rel_tol form one multiplet. Each
    entry has the member indices, mean frequency, size, kind, l, and whether the size equals
    2l+1; entries are sorted by frequency. On meshes too coarse for harmonics up to lmax,
    lmax is lowered to what the surface points can fit.
    """
    f = np.asarray(frequencies, dtype=float)
    if vectors.shape[1] != f.size:
        raise ValueError(f"{vectors.shape[1]} vectors for {f.size} frequencies")
    if core_fraction is not None and np.shape(core_fraction) != f.shape:
        raise ValueError(f"core_fraction must have shape {f.shape}")
    from .assembly import point_dofs

    # a coarse mesh cannot carry harmonics up to lmax: fit what its surface points can
    surface_points = surface_weights(mesh)[0].size
    while lmax > 1 and 3 * surface_points < 2 * (3 * (lmax + 1) ** 2 - 2):
        lmax -= 1
    _, fit = surface_fit(mesh, lmax)
    dofs = point_dofs(mesh, basis)[fit.nodes]
    ids = [identify_mode(mesh, vectors[:, i], basis, fit=fit, surface_dofs=dofs)
           for i in range(f.size)]
    labels = [("C", -1) if core_fraction is not None and core_fraction[i] > core_threshold
              else (m.kind, m.l) for i, m in enumerate(ids)]
    out = []
    for label in sorted(set(labels)):
        idx = np.array([i for i, lab in enumerate(labels) if lab == label])
        for g in group_multiplets(f[idx], rel_tol):
            members = idx[g]
            kind, l = label
            out.append(
                {
                    "members": members,
                    "frequency": float(f[members].mean()),
                    "size": int(members.size),
                    "kind": kind,
                    "l": int(l),
                    "complete": bool(kind != "C" and members.size == 2 * l + 1),
                    "ids": [ids[i] for i in members],
                }
            )
    out.sort(key=lambda m: m["frequency"])
    return out
