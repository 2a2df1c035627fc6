"""Normal-mode eigenvectors as fields on the mesh nodes, and VTU files for ParaView.

Implements the output side of the NormalModes pipeline (Shi, Li, Xi, Saad and de Hoop,
SC'18, "Computing planetary interior normal modes with a highly parallel polynomial
filtering eigensolver"), whose post-processing writes eigenvectors as VTK files, for the
SC19 reproduction in this package:

    write_vtu("modes.vtu", mesh, basis, vectors, freqs, labels=["0T2"] * 5 + ...)

The VTU holds the mesh as it is: 4-node "tetra" cells for an order-1 mesh, 10-node
"tetra10" cells (all nodes, VTK order) for a curved order-2 mesh. Each mode is a point-data
3-vector at every node; for P2 on a curved mesh that is the full set of nodal values, so
ParaView's quadratic cells reproduce the P2 field. Point data "radius" and cell data
"layer" (0 = innermost) come along so the file can be clipped by depth or region. The file
is replaced atomically (`furnace.runtime.atomic`).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from furnace.runtime.atomic import OutputError, atomic_save

from .assembly import point_dofs
from .mesh import TetMesh


def point_displacement(mesh: TetMesh, basis, u: np.ndarray) -> np.ndarray:
    """Displacement [n_points, 3] at every node of `mesh` from a dof vector u of `basis`."""
    u = np.asarray(u)
    if u.ndim != 1 or u.shape[0] != basis.N:
        raise ValueError(f"eigenvector must be a vector of length {basis.N}, got {u.shape}")
    return np.real(u)[point_dofs(mesh, basis)]


def mode_field_names(frequencies_mhz, labels=None) -> list[str]:
    """Point-data names like "mode_003_0T2_0.5062mHz": index, label, frequency.

    Characters other than letters, digits, "_" and "." become "_" (VTK readers and
    ParaView's calculator choke on spaces and operators), and repeated names get a suffix.
    """
    f = np.atleast_1d(np.asarray(frequencies_mhz, dtype=float))
    if labels is not None and len(labels) != f.size:
        raise ValueError(f"{len(labels)} labels for {f.size} modes")
    names, seen = [], set()
    for i, fi in enumerate(f):
        parts = [f"mode_{i:03d}"]
        if labels is not None and str(labels[i]):
            parts.append(str(labels[i]))
        parts.append(f"{fi:.4f}mHz")
        base = re.sub(r"[^A-Za-z0-9_.]+", "_", "_".join(parts))
        name, k = base, 2
        while name in seen:
            name, k = f"{base}_{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def write_vtu(
    path, mesh: TetMesh, basis, eigenvectors, frequencies_mhz, labels=None
) -> Path:
    """Write the modes as a VTU (see the module docstring for the layout); returns the path.

    eigenvectors: [n_dofs, n_modes] in the dof layout of `basis` (a single vector is one
    mode); frequencies_mhz: one per mode; labels: optional names such as "0T2" or "S3".
    """
    import meshio

    vecs = np.asarray(eigenvectors)
    if vecs.ndim == 1:
        vecs = vecs[:, None]
    f = np.atleast_1d(np.asarray(frequencies_mhz, dtype=float))
    if vecs.ndim != 2 or vecs.shape[0] != basis.N:
        raise ValueError(f"eigenvectors must be [{basis.N}, n_modes], got {vecs.shape}")
    if vecs.shape[1] != f.size:
        raise ValueError(f"{vecs.shape[1]} eigenvectors for {f.size} frequencies")
    dofs = point_dofs(mesh, basis)
    vecs = np.real(vecs)
    point_data = {"radius": np.linalg.norm(mesh.points, axis=1)}
    for j, name in enumerate(mode_field_names(f, labels)):
        point_data[name] = np.ascontiguousarray(vecs[dofs, j])
    cell_type = "tetra" if mesh.tets.shape[1] == 4 else "tetra10"
    out = meshio.Mesh(
        np.asarray(mesh.points, dtype=float),
        [(cell_type, np.asarray(mesh.tets, dtype=np.int64))],
        point_data=point_data,
        cell_data={"layer": [np.asarray(mesh.layer, dtype=np.int32)]},
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # meshio's VTU writer opens a file by name, so it writes a scratch copy that is then
    # moved into place atomically: a failed or killed run never leaves half a VTU at path
    try:
        with tempfile.TemporaryDirectory(prefix="furnace-vtu-") as scratch:
            draft = Path(scratch) / "modes.vtu"
            # the .vtu writer is chosen explicitly so another suffix still gets VTU
            meshio.write(draft, out, file_format="vtu")
            with open(draft, "rb") as src:
                atomic_save(path, lambda dst: shutil.copyfileobj(src, dst))
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path
