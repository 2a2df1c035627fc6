"""Pictures of planetary normal modes: surface maps and meridional sections.

Implements the mode maps of the SC19 reproduction of Shi, Li, Xi, Saad and de Hoop (SC'18,
"Computing planetary interior normal modes with a highly parallel polynomial filtering
eigensolver"; design note eigensolver.md section 5): the radial displacement u_r of a
spheroidal mode, or the tangential magnitude |u_t| of a toroidal one, on the surface as a
filled contour map (longitude-latitude or Mollweide), and |u| on the meridional plane
y = 0, which shows how deep a mode reaches and where the fluid core is.

Figures are built on an Agg canvas through matplotlib's object API rather than pyplot, so
making many of them in a loop or a headless run leaks no global figure state:

    fig = mode_figure(mesh, basis, u, label="0T2", frequency_mhz=0.3796, fluid_radius=1830)
    fig.savefig("0T2.png", dpi=120)

Amplitudes are shown relative to the largest |u| (eigenvectors have arbitrary scale and
sign), on the surface for the map and over the whole mesh for the section.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .export import point_displacement
from .identify import surface_weights
from .mesh import TetMesh

KINDS = ("auto", "radial", "tangential")
PROJECTIONS = ("mollweide", "latlon")
# below this share of surface |u|^2 in u_r a mode is drawn as |u_t|: toroidal modes keep u_r
# at the discretisation-error level (0.1 % on the h = 0.15 ball), while spheroidal ones
# carry a few percent at least (1S1 of the Poisson ball: 8 %)
RADIAL_SHARE_MIN = 0.02


@dataclass
class SurfaceField:
    """Displacement at the surface vertices split into radial and tangential parts.

    lon, lat are in radians; u_r and u_t (= |u_t|) are divided by the largest surface |u|;
    weights are the lumped vertex areas; surface_share is that largest surface |u| over the
    largest |u| anywhere in the mesh (small for modes trapped at depth, e.g. in the core).
    """

    xyz: np.ndarray
    lon: np.ndarray
    lat: np.ndarray
    u_r: np.ndarray
    u_t: np.ndarray
    weights: np.ndarray
    surface_share: float = 1.0

    @property
    def radial_share(self) -> float:
        """Area-weighted share of sum |u|^2 carried by u_r (0 for a pure toroidal field)."""
        total = float(np.sum(self.weights * (self.u_r**2 + self.u_t**2)))
        return float(np.sum(self.weights * self.u_r**2) / total) if total > 0 else 0.0

    def auto_kind(self) -> str:
        return "tangential" if self.radial_share < RADIAL_SHARE_MIN else "radial"


def surface_field(mesh: TetMesh, basis, u: np.ndarray) -> SurfaceField:
    """Sample the dof vector u (layout of `basis`) at the surface vertices of `mesh`."""
    disp_all = point_displacement(mesh, basis, u)
    nodes, w = surface_weights(mesh)
    xyz = mesh.points[nodes]
    disp = disp_all[nodes]
    rhat = xyz / np.linalg.norm(xyz, axis=1, keepdims=True)
    u_r = np.einsum("ij,ij->i", disp, rhat)
    u_t = np.linalg.norm(disp - u_r[:, None] * rhat, axis=1)
    scale = float(np.sqrt(u_r**2 + u_t**2).max())
    peak = float(np.linalg.norm(disp_all, axis=1).max())
    if scale > 0:
        u_r, u_t = u_r / scale, u_t / scale
    lon = np.arctan2(rhat[:, 1], rhat[:, 0])
    lat = np.arcsin(np.clip(rhat[:, 2], -1.0, 1.0))
    return SurfaceField(xyz, lon, lat, u_r, u_t, w, scale / peak if peak > 0 else 1.0)


def _wrapped_triangulation(lon, lat, values, margin=0.7):
    """Delaunay triangulation in (lon, lat) that is seamless over [-pi, pi] x [-pi/2, pi/2].

    Points within `margin` (radians, about 40 deg) of the +-180 deg seam are repeated
    360 deg over, so triangles cross the seam in the copy and the axes clip them; a row of
    points at each pole (with the value of the vertex nearest to it) closes the strips that
    the sphere's poles open in this plane.
    """
    import matplotlib.tri as mtri

    pole = np.abs(lat) > np.pi / 2 - 1e-9
    north, south = int(np.argmax(lat)), int(np.argmin(lat))
    lo, la, va = lon[~pole], lat[~pole], values[~pole]
    east, west = lo > np.pi - margin, lo < -np.pi + margin
    row = np.linspace(-np.pi - margin, np.pi + margin, 73)
    lon_all = np.concatenate([lo, lo[east] - 2 * np.pi, lo[west] + 2 * np.pi, row, row])
    lat_all = np.concatenate(
        [la, la[east], la[west], np.full(row.size, np.pi / 2), np.full(row.size, -np.pi / 2)]
    )
    val_all = np.concatenate(
        [va, va[east], va[west], np.full(row.size, values[north]), np.full(row.size, values[south])]
    )
    return mtri.Triangulation(lon_all, lat_all), val_all


def _new_figure(figsize):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def surface_map(
    mesh: TetMesh,
    basis,
    u: np.ndarray,
    *,
    kind: str = "auto",
    projection: str = "mollweide",
    title: str | None = None,
    ax=None,
):
    """Filled contour map of u_r ("radial") or |u_t| ("tangential") on the surface.

    kind="auto" draws |u_t| when u_r carries under RADIAL_SHARE_MIN of the surface energy
    (a toroidal mode), u_r otherwise. projection "mollweide" needs a Mollweide axes if ax
    is given; "latlon" draws on plain axes in degrees. Returns the axes; the default
    title names the quantity drawn.
    """
    import matplotlib.tri as mtri
    from matplotlib.ticker import MaxNLocator

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if projection not in PROJECTIONS:
        raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
    if ax is None:
        fig = _new_figure((8.0, 4.6))
        ax = fig.add_subplot(projection="mollweide" if projection == "mollweide" else None)
    elif (ax.name == "mollweide") != (projection == "mollweide"):
        raise ValueError(f"projection={projection!r} but the axes given are {ax.name!r}")
    sf = surface_field(mesh, basis, u)
    if kind == "auto":
        kind = sf.auto_kind()
    if kind == "radial":
        values, cmap, qty = sf.u_r, "RdBu_r", "$u_r$"
        vmax = float(np.abs(values).max()) or 1.0
        levels = np.linspace(-vmax, vmax, 21)
    else:
        values, cmap, qty = sf.u_t, "viridis", "$|u_t|$"
        levels = np.linspace(0.0, float(values.max()) or 1.0, 21)
    tri, vals = _wrapped_triangulation(sf.lon, sf.lat, values)
    if projection == "mollweide":
        cs = ax.tricontourf(tri, vals, levels=levels, cmap=cmap)
        ax.grid(True, color="0.5", lw=0.4, alpha=0.6)
        ax.tick_params(axis="x", labelsize=7, colors="0.3")
    else:
        deg = mtri.Triangulation(np.degrees(tri.x), np.degrees(tri.y), tri.triangles)
        cs = ax.tricontourf(deg, vals, levels=levels, cmap=cmap)
        ax.set_xlim(-180.0, 180.0)
        ax.set_ylim(-90.0, 90.0)
        ax.set_aspect("equal")
        ax.set_xticks(np.arange(-180, 181, 60))
        ax.set_yticks(np.arange(-90, 91, 30))
        ax.set_xlabel("longitude (deg)")
        ax.set_ylabel("latitude (deg)")
    # the share tells a surface mode from one trapped at depth, whose map is mostly noise
    ax.figure.colorbar(
        cs, ax=ax, orientation="horizontal", shrink=0.6, aspect=35, pad=0.06,
        ticks=MaxNLocator(7),
        label=f"{qty} / max $|u|$ at the surface (which is {sf.surface_share:.2g} of max $|u|$)",
    )
    ax.set_title(title if title is not None else f"surface {qty}")
    return ax


@dataclass
class Section:
    """|u| / max |u| on a polar grid in the plane y = 0: x, z, amplitude are [n_theta, n_r]
    arrays. The disc has no gaps: points just outside the polyhedral mesh are extrapolated
    from the tet next to them."""

    x: np.ndarray
    z: np.ndarray
    amplitude: np.ndarray


def _interpolate_in_tets(mesh: TetMesh, disp: np.ndarray, q: np.ndarray):
    """Displacement at points q [n, 3] on y = 0, interpolated in the tets the plane cuts.

    Each point is located by its barycentric coordinates among the tets with the nearest
    centroids, widening the search (16, 128, 1024 tets) for points not inside any; the best
    tet is the one whose smallest coordinate is largest. Points in the slivers between the
    flat surface facets and the sphere lie outside every tet and are extrapolated linearly
    from the best one (it touches the nearest facet); coordinates are kept >= -0.5 so that
    a poorly chosen tet cannot blow the value up. P1 interpolates the corner values; on an
    order-2 mesh straight tets use all ten nodes with the quadratic shape functions, while
    curved ones (at the surface) fall back to their corners: the barycentric coordinates of
    the straight tet are not the curved tet's reference coordinates, and on coarse meshes
    the mismatch made the quadratic interpolant worse than the linear one.
    """
    from scipy.spatial import cKDTree

    corners = mesh.points[mesh.vertex_tets]
    y = corners[:, :, 1]
    cut = np.nonzero((y.min(axis=1) <= 0.0) & (y.max(axis=1) >= 0.0))[0]
    if cut.size == 0:
        raise ValueError("no tet of the mesh meets the plane y = 0")
    c = corners[cut]
    edges = np.stack([c[:, 1] - c[:, 0], c[:, 2] - c[:, 0], c[:, 3] - c[:, 0]], axis=2)
    inv = np.linalg.inv(edges)
    tree = cKDTree(c.mean(axis=1))
    tet = np.zeros(len(q), dtype=np.int64)
    lam = np.zeros((len(q), 4))
    todo = np.arange(len(q))
    for k in (16, 128, 1024):
        k = min(k, cut.size)
        _, cand = tree.query(q[todo], k=k)
        cand = cand.reshape(len(todo), k)
        rows = max(1, 2**19 // k)  # bounds the [rows, k, 3] temporaries
        for s in range(0, len(todo), rows):
            idx, cs = todo[s : s + rows], cand[s : s + rows]
            l123 = np.einsum("nkij,nkj->nki", inv[cs], q[idx, None, :] - c[cs, 0])
            lk = np.concatenate([1.0 - l123.sum(axis=2, keepdims=True), l123], axis=2)
            best = np.argmax(lk.min(axis=2), axis=1)
            tet[idx] = cs[np.arange(len(idx)), best]
            lam[idx] = lk[np.arange(len(idx)), best]
        todo = todo[lam[todo].min(axis=1) < -1e-9]
        if todo.size == 0 or k == cut.size:
            break
    lam = np.clip(lam, -0.5, None)
    lam /= lam.sum(axis=1, keepdims=True)
    nodes = mesh.tets[cut[tet]]
    linear = np.einsum("nj,njd->nd", lam, disp[nodes[:, :4]])
    if nodes.shape[1] != 10:
        return linear
    # VTK tetra10 edge order: 0-1, 1-2, 2-0, 0-3, 1-3, 2-3
    a = np.array([0, 1, 2, 0, 1, 2])
    b = np.array([1, 2, 0, 3, 3, 3])
    p = mesh.points
    bend = np.linalg.norm(p[nodes[:, 4:]] - 0.5 * (p[nodes[:, a]] + p[nodes[:, b]]), axis=2)
    straight = bend.max(axis=1) <= 1e-9 * mesh.radius
    shape = np.concatenate([lam * (2.0 * lam - 1.0), 4.0 * lam[:, a] * lam[:, b]], axis=1)
    quadratic = np.einsum("nj,njd->nd", shape, disp[nodes])
    return np.where(straight[:, None], quadratic, linear)


def section_grid(
    mesh: TetMesh, basis, u: np.ndarray, *, n_r: int = 80, n_theta: int = 241
) -> Section:
    """|u| on a regular polar grid (radius x angle from +z) of the plane y = 0."""
    disp = point_displacement(mesh, basis, u)
    r = np.linspace(0.0, mesh.radius, n_r)
    theta = np.linspace(0.0, 2.0 * np.pi, n_theta)
    x = np.outer(np.sin(theta), r)
    z = np.outer(np.cos(theta), r)
    q = np.stack([x.ravel(), np.zeros(x.size), z.ravel()], axis=1)
    amp = np.linalg.norm(_interpolate_in_tets(mesh, disp, q), axis=1).reshape(x.shape)
    scale = float(np.linalg.norm(disp, axis=1).max())
    return Section(x, z, amp / scale if scale > 0 else amp)


def meridional_section(
    mesh: TetMesh,
    basis,
    u: np.ndarray,
    *,
    fluid_radius: float | None = None,
    ax=None,
    title: str | None = None,
):
    """|u| on the meridional plane y = 0 (x-z plane, km), the fluid core dashed if given.

    Returns the axes.
    """
    import matplotlib.patches as mpatches
    from matplotlib.ticker import MaxNLocator

    if ax is None:
        fig = _new_figure((5.0, 4.8))
        ax = fig.add_subplot()
    sec = section_grid(mesh, basis, u)
    vmax = float(np.nanmax(sec.amplitude)) or 1.0
    pm = ax.pcolormesh(
        sec.x, sec.z, sec.amplitude, shading="gouraud", cmap="magma", vmin=0.0, vmax=vmax,
        rasterized=True,
    )
    ax.add_patch(mpatches.Circle((0, 0), mesh.radius, fill=False, color="k", lw=0.8))
    if fluid_radius is not None and 0 < fluid_radius < mesh.radius:
        ax.add_patch(
            mpatches.Circle((0, 0), fluid_radius, fill=False, color="w", lw=1.2, ls="--")
        )
    ax.set_aspect("equal")
    pad = 0.03 * mesh.radius
    ax.set_xlim(-mesh.radius - pad, mesh.radius + pad)
    ax.set_ylim(-mesh.radius - pad, mesh.radius + pad)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    ax.set_xlabel("x (km)")
    ax.set_ylabel("z (km)")
    ax.figure.colorbar(pm, ax=ax, shrink=0.8, label="$|u|$ / max $|u|$")
    ax.set_title(title if title is not None else "meridional section $y = 0$, $|u|$")
    return ax


def mode_figure(
    mesh: TetMesh,
    basis,
    u: np.ndarray,
    *,
    label: str,
    frequency_mhz: float,
    fluid_radius: float | None = None,
    kind: str = "auto",
    projection: str = "mollweide",
):
    """One mode as a Figure: surface map (left) and meridional section (right).

    kind and projection go to surface_map; the suptitle is the label and the frequency.
    """
    fig = _new_figure((13.0, 5.0))
    grid = fig.add_gridspec(1, 2, width_ratios=[1.75, 1.0])
    ax_map = fig.add_subplot(grid[0], projection="mollweide" if projection == "mollweide" else None)
    ax_sec = fig.add_subplot(grid[1])
    surface_map(mesh, basis, u, kind=kind, projection=projection, ax=ax_map)
    meridional_section(mesh, basis, u, fluid_radius=fluid_radius, ax=ax_sec)
    fig.suptitle(f"{label}   f = {frequency_mhz:.4f} mHz")
    return fig
