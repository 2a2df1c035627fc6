"""Conforming tetrahedral meshes of a layered ball, built with gmsh (OpenCASCADE kernel).

This plays the role of the PlanetaryModels mesher (TetGen + distmesh) used by NormalModes
(Shi et al., SC'18, "Computing planetary interior normal modes with a highly parallel
polynomial filtering eigensolver"): concentric spheres at the layer interfaces are
fragmented together so that the layers share their interface triangles (the mesh is
"welded": one node set, no duplicated interface vertices), and each layer is a physical
volume tagged by its index counted from the centre.

    mesh = ball_mesh(6371.0, 600.0, interfaces=(3480.0,))
    mesh.points, mesh.tets, mesh.layer       # [n,3] km, [m,4] int, [m] int
    skmesh = mesh.to_skfem()                 # skfem.MeshTet (MeshTet2 for order=2)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# gmsh's 10-node tetrahedron lists the edges (0-1, 1-2, 2-0, 3-0, 3-2, 3-1); meshio/VTK
# (and therefore skfem's meshio reader) use (0-1, 1-2, 2-0, 0-3, 1-3, 2-3).
_GMSH_TET10_TO_VTK = np.array([0, 1, 2, 3, 4, 5, 6, 7, 9, 8])


@dataclass
class TetMesh:
    """A tetrahedral mesh of a layered ball.

    points: node coordinates [n, 3]; tets: node indices [m, 4] (order 1) or [m, 10]
    (order 2, VTK/meshio node order); layer: layer index per tet, 0 = innermost;
    radii: outer radius of each layer (the last one is the surface radius).
    """

    points: np.ndarray
    tets: np.ndarray
    layer: np.ndarray
    radii: tuple[float, ...]
    order: int = 1
    mesh_size: float = field(default=float("nan"))

    @property
    def radius(self) -> float:
        return float(self.radii[-1])

    @property
    def n_layers(self) -> int:
        return len(self.radii)

    @property
    def vertex_tets(self) -> np.ndarray:
        """The four corner nodes of every tet (the straight-sided tet), [m, 4]."""
        return self.tets[:, :4]

    def layer_bounds(self) -> np.ndarray:
        """[n_layers, 2] inner and outer radius of each layer."""
        outer = np.asarray(self.radii, dtype=float)
        inner = np.concatenate([[0.0], outer[:-1]])
        return np.stack([inner, outer], axis=1)

    def volume(self) -> float:
        """Volume of the straight-sided (polyhedral) mesh."""
        p = self.points[self.vertex_tets]
        d = np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), p[:, 3] - p[:, 0])
        return float(np.abs(d).sum() / 6.0)

    def boundary_nodes(self) -> np.ndarray:
        """Vertex indices on the outer surface (faces that belong to one tet only)."""
        return np.unique(self.boundary_faces())

    def boundary_faces(self) -> np.ndarray:
        """Corner-node triangles of the outer surface, [k, 3]."""
        t = self.vertex_tets
        faces = np.concatenate([t[:, [1, 2, 3]], t[:, [0, 2, 3]], t[:, [0, 1, 3]], t[:, [0, 1, 2]]])
        key = np.sort(faces, axis=1)
        _, inv, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        return faces[counts[inv.ravel()] == 1]

    def to_skfem(self):
        """The mesh as a `skfem.MeshTet` (order 1) or curved `skfem.MeshTet2` (order 2)."""
        import skfem

        if self.order == 1:
            return skfem.MeshTet(
                np.ascontiguousarray(self.points.T, dtype=float),
                np.ascontiguousarray(self.tets.T, dtype=np.int64),
            )
        import meshio
        from skfem.io.meshio import from_meshio

        return from_meshio(meshio.Mesh(self.points, [("tetra10", self.tets)]))


def ball_mesh(
    radius: float,
    mesh_size: float,
    interfaces: tuple[float, ...] | list[float] = (),
    *,
    order: int = 1,
    surface_refine: float | None = None,
) -> TetMesh:
    """Mesh the ball of `radius` with internal spherical interfaces at `interfaces`.

    mesh_size is the target edge length in the same units as radius (km for planets, or
    h relative to a unit ball). surface_refine, if given, is the edge length on the outer
    sphere (useful because the surface-wave-like modes live there). The result is
    deterministic for fixed inputs: gmsh runs single-threaded with a fixed seed.
    """
    radius = float(radius)
    if not np.isfinite(radius) or radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}")
    if not np.isfinite(mesh_size) or mesh_size <= 0:
        raise ValueError(f"mesh_size must be positive, got {mesh_size}")
    if mesh_size > radius:
        raise ValueError(f"mesh_size {mesh_size} exceeds the radius {radius}; nothing to mesh")
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    rs = sorted(float(r) for r in interfaces)
    for r in rs:
        if not 0.0 < r < radius:
            raise ValueError(f"interface radius {r} must lie strictly inside (0, {radius})")
    if len(set(rs)) != len(rs):
        raise ValueError(f"interface radii must be distinct, got {rs}")
    radii = (*rs, radius)

    import gmsh

    # Do not tear down a gmsh session that a caller owns; work in our own model instead.
    owns_session = not gmsh.isInitialized()
    if owns_session:
        gmsh.initialize(["", "-v", "0"], readConfigFiles=False)
    model_name = "furnace_ball_mesh"
    try:
        gmsh.option.setNumber("General.Terminal", 0)
        gmsh.option.setNumber("General.Verbosity", 0)
        gmsh.model.add(model_name)
        occ = gmsh.model.occ
        spheres = [occ.addSphere(0.0, 0.0, 0.0, r) for r in radii]
        # fragment cuts the nested spheres into disjoint shells that share their interface
        # surfaces, which is what makes the volume mesh conforming across interfaces
        occ.fragment([(3, spheres[-1])], [(3, s) for s in spheres[:-1]])
        occ.synchronize()

        vols = gmsh.model.getEntities(3)
        layer_of_vol = {}
        for _, tag in vols:
            # fragment renumbers volumes; shells of distinct radii have distinct volumes
            vol = occ.getMass(3, tag)
            layer_of_vol[tag] = _match_shell(vol, radii)
        if sorted(layer_of_vol.values()) != list(range(len(radii))):
            raise RuntimeError(f"gmsh fragment gave unexpected volumes {layer_of_vol}")
        for tag, k in sorted(layer_of_vol.items()):
            pg = gmsh.model.addPhysicalGroup(3, [tag], tag=k + 1)
            gmsh.model.setPhysicalName(3, pg, f"layer{k}")

        gmsh.option.setNumber("General.NumThreads", 1)
        gmsh.option.setNumber("Mesh.RandomSeed", 1)
        gmsh.option.setNumber("Mesh.Algorithm", 6)
        gmsh.option.setNumber("Mesh.Algorithm3D", 1)
        gmsh.option.setNumber("Mesh.MeshSizeFromCurvature", 0)
        gmsh.option.setNumber("Mesh.MeshSizeExtendFromBoundary", 1)
        gmsh.option.setNumber("Mesh.MeshSizeFromPoints", 0)
        gmsh.option.setNumber("Mesh.MeshSizeMax", float(mesh_size))
        gmsh.option.setNumber("Mesh.MeshSizeMin", 0.0)
        gmsh.option.setNumber("Mesh.Optimize", 1)
        gmsh.option.setNumber("Mesh.ElementOrder", order)
        if surface_refine is not None:
            if not 0 < surface_refine <= mesh_size:
                raise ValueError(
                    f"surface_refine must be in (0, mesh_size={mesh_size}], got {surface_refine}"
                )
            fld = gmsh.model.mesh.field
            dist = fld.add("MathEval")
            # linear ramp from surface_refine at r=R to mesh_size at depth ~ 4*mesh_size
            fld.setString(
                dist,
                "F",
                f"Min({mesh_size}, {surface_refine} + "
                f"({mesh_size}-{surface_refine})*({radius}-Sqrt(x*x+y*y+z*z))/{4 * mesh_size})",
            )
            fld.setAsBackgroundMesh(dist)
        gmsh.model.mesh.generate(3)
        if order == 2:
            gmsh.model.mesh.setOrder(2)

        node_tags, coords, _ = gmsh.model.mesh.getNodes()
        coords = coords.reshape(-1, 3)
        etype = 4 if order == 1 else 11
        nper = 4 if order == 1 else 10
        tets_l, layers_l = [], []
        for tag, k in sorted(layer_of_vol.items(), key=lambda kv: kv[1]):
            _, enodes = gmsh.model.mesh.getElementsByType(etype, tag)
            t = np.asarray(enodes, dtype=np.int64).reshape(-1, nper)
            tets_l.append(t)
            layers_l.append(np.full(t.shape[0], k, dtype=np.int64))
    finally:
        if owns_session:
            gmsh.finalize()
        else:
            gmsh.model.setCurrent(model_name)
            gmsh.model.remove()

    tets_tagged = np.concatenate(tets_l)
    layer = np.concatenate(layers_l)
    # compact renumbering; gmsh tags are unique across entities, so interface nodes are
    # shared by the tets on both sides by construction
    used = np.unique(tets_tagged)
    lookup = np.full(int(node_tags.max()) + 1, -1, dtype=np.int64)
    lookup[np.asarray(node_tags, dtype=np.int64)] = np.arange(len(node_tags))
    coords = coords[lookup[used]]
    remap = np.full(int(used.max()) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    tets = remap[tets_tagged]
    if order == 2:
        tets = tets[:, _GMSH_TET10_TO_VTK]
    tets = _orient_positive(coords, tets)
    coords, tets = _bandwidth_order(coords, tets)
    return TetMesh(
        points=np.ascontiguousarray(coords, dtype=float),
        tets=np.ascontiguousarray(tets),
        layer=layer,
        radii=radii,
        order=order,
        mesh_size=float(mesh_size),
    )


def _bandwidth_order(points: np.ndarray, tets: np.ndarray):
    """Renumber the nodes by reverse Cuthill-McKee on the tets' node graph.

    gmsh's node numbers are nearly random in space, so a sparse matrix-vector product
    gathers its inputs from all over memory; a banded numbering keeps them in cache.
    Every SpMV-bound solver in the package (the filtered Lanczos above all) runs faster for
    it, and the result is still deterministic.
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n, k = len(points), tets.shape[1]
    rows = np.repeat(tets, k, axis=1).ravel()
    cols = np.tile(tets, (1, k)).ravel()
    graph = sp.csr_matrix((np.ones(rows.size, dtype=np.int8), (rows, cols)), shape=(n, n))
    order = reverse_cuthill_mckee(graph, symmetric_mode=True)
    new_index = np.empty(n, dtype=np.int64)
    new_index[order] = np.arange(n)
    return points[order], new_index[tets]


def _match_shell(volume: float, radii: tuple[float, ...]) -> int:
    outer = np.asarray(radii)
    inner = np.concatenate([[0.0], outer[:-1]])
    shell = 4.0 / 3.0 * np.pi * (outer**3 - inner**3)
    k = int(np.argmin(np.abs(shell - volume) / shell))
    if abs(shell[k] - volume) > 1e-3 * shell[k]:
        raise RuntimeError(f"gmsh volume {volume} matches no shell of radii {radii}")
    return k


def _orient_positive(points: np.ndarray, tets: np.ndarray) -> np.ndarray:
    # skfem and the volume formula assume a consistent orientation; swapping two corners
    # (and, for order 2, the matching edge nodes) flips a negatively oriented tet
    p = points[tets[:, :4]]
    d = np.einsum("ij,ij->i", np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), p[:, 3] - p[:, 0])
    neg = d < 0
    if not neg.any():
        return tets
    tets = tets.copy()
    if tets.shape[1] == 4:
        tets[neg] = tets[neg][:, [1, 0, 2, 3]]
    else:
        # swapping corners 0 and 1: edges 1-2 <-> 2-0 and 1-3 <-> 0-3 exchange
        tets[neg] = tets[neg][:, [1, 0, 2, 3, 4, 6, 5, 8, 7, 9]]
    return tets
