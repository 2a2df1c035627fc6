"""One normal-mode computation end to end: mesh, assemble, filtered Lanczos, identify.

The pipeline of NormalModes (Shi et al., SC'18) with the simplifications of this package:
no gravity (their JOB=1), the split-node fluid core for P1 (welded for P2), and one
spectrum slice unless asked.
Frequencies are in mHz (f = 1e3 sqrt(lambda) / 2 pi with km, g/cm^3 and km/s units).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ModesResult:
    """Eigenfrequencies in [fmin, fmax], their multiplets and what it cost.

    mesh, basis and eigenvectors ([n_dofs, n_modes], column j for frequencies_mhz[j]) are kept
    for plots and VTU export (furnace.normal_modes.plots, .export).
    """

    planet: str
    unknowns: int
    frequencies_mhz: np.ndarray
    multiplets: list[dict] = field(default_factory=list)
    # set by `solve`: furnace.eigen.operators.Counters, the TetMesh and its dof basis
    counters: Any = None
    seconds: dict = field(default_factory=dict)
    mesh: Any = None
    basis: Any = None
    eigenvectors: np.ndarray | None = None


def core_dofs(mesh, basis, model) -> np.ndarray:
    """Dofs that move with the fluid core only: the fluid-side copies of the split form, or
    (welded) the dofs of nodes that belong to fluid tets alone."""
    from .assembly import element_material, point_dofs
    from .fluid_solid import SplitDofs

    if isinstance(basis, SplitDofs):
        return basis.fluid_dofs().ravel()
    fluid = element_material(mesh, lambda r: model.at(r)).fluid
    in_fluid = np.zeros(len(mesh.points), bool)
    in_solid = np.zeros(len(mesh.points), bool)
    in_fluid[mesh.tets[fluid].ravel()] = True
    in_solid[mesh.tets[~fluid].ravel()] = True
    return point_dofs(mesh, basis)[in_fluid & ~in_solid].ravel()


def compute_modes(planet: str, fmin_mhz: float, fmax_mhz: float, *, mesh_size: float,
                  order: int = 1, lumped: bool | None = None, slices: int = 1,
                  identify: bool = True, data_dir=None, fluid: str | None = None,
                  comm=None, mode: str = "slices", group_size: int | None = None,
                  progress=None) -> ModesResult:
    """Normal modes of ``planet`` ("ball", "mars", "prem", "moon") with f in [fmin, fmax].

    Args:
        mesh_size: target edge length relative to the planet's radius.
        order: 1 (P1) or 2 (P2).
        lumped: lumped mass (default for P1, as the benchmarks run; P2 needs consistent).
        slices: spectrum slices of the filtered Lanczos solver.
        fluid: "split" (NormalModes' split-node pressure form, the default for P1) or
            "welded" (the simplification, the only form for P2).
        comm, mode, group_size: an mpi4py communicator with more than one rank runs the
            solver with `eigsh_interval_mpi` in that parallel mode; every rank meshes and
            assembles the same (deterministic) problem and gets the same result.
        progress: optional callable(text) told what stage the computation is in.
    """
    from furnace.eigen import SolverConfig, eigsh_interval

    from .assembly import assemble
    from .config import ModesConfig
    from .identify import identify_multiplets, kinetic_fraction
    from .mesh import ball_mesh
    from .models import from_mhz, homogeneous_ball, load_planet, to_mhz

    cfg = ModesConfig(planet=planet, fmin_mhz=fmin_mhz, fmax_mhz=fmax_mhz,
                      mesh_size=mesh_size, order=order, lumped=lumped, fluid=fluid,
                      slices=slices)
    lumped, fluid = cfg.lumped_mass, cfg.fluid_form
    say = progress or (lambda text: None)
    model = homogeneous_ball() if planet == "ball" else load_planet(planet, data_dir)
    radius = model.surface_radius
    interfaces = tuple(r for r in (model.fluid_core_radius,) if 0 < r < radius)
    seconds = {}
    say("meshing")
    t0 = time.perf_counter()
    mesh = ball_mesh(radius, mesh_size * radius, interfaces, order=order)
    seconds["mesh"] = time.perf_counter() - t0
    say(f"assembling ({mesh.tets.shape[0]} tetrahedra)")
    t0 = time.perf_counter()
    K, M, basis = assemble(mesh, lambda r: model.at(r), order=order, lumped=lumped,
                           return_basis=True, fluid=fluid)
    seconds["assembly"] = time.perf_counter() - t0
    a, b = float(from_mhz(fmin_mhz)), float(from_mhz(fmax_mhz))
    config = SolverConfig(a=a, b=b, mass="lumped" if lumped else "consistent")
    say(f"filtered Lanczos on {K.shape[0]} unknowns")
    t0 = time.perf_counter()
    if comm is not None and comm.Get_size() > 1:
        from furnace.eigen import eigsh_interval_mpi

        res = eigsh_interval_mpi(K, M, a, b, comm=comm, config=config, slices=slices,
                                 mode=mode, group_size=group_size)
    else:
        res = eigsh_interval(K, M, a, b, config=config, slices=slices, progress=lambda text:
                             say(f"filtered Lanczos on {K.shape[0]} unknowns: {text}"))
    seconds["solve"] = time.perf_counter() - t0
    freqs = np.asarray(to_mhz(res.eigenvalues))
    multiplets = []
    if identify and freqs.size:
        say(f"identifying {freqs.size} modes")
        t0 = time.perf_counter()
        core = kinetic_fraction(M, res.eigenvectors, core_dofs(mesh, basis, model))
        multiplets = identify_multiplets(mesh, freqs, res.eigenvectors, basis,
                                         core_fraction=core)
        seconds["identify"] = time.perf_counter() - t0
    return ModesResult(planet, K.shape[0], freqs, multiplets, res.counters, seconds,
                       mesh=mesh, basis=basis, eigenvectors=res.eigenvectors)
