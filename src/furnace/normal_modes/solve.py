"""One normal-mode computation end to end: mesh, assemble, filtered Lanczos, identify.

The pipeline of NormalModes (Shi et al., SC'18) with the simplifications of this package:
no gravity (their JOB=1), a welded fluid core, and one spectrum slice unless asked.
Frequencies are in mHz (f = 1e3 sqrt(lambda) / 2 pi with km, g/cm^3 and km/s units).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ModesResult:
    """Eigenfrequencies in [fmin, fmax], their multiplets and what it cost."""

    planet: str
    unknowns: int
    frequencies_mhz: np.ndarray
    multiplets: list[dict] = field(default_factory=list)
    counters: object = None
    seconds: dict = field(default_factory=dict)


def compute_modes(planet: str, fmin_mhz: float, fmax_mhz: float, *, mesh_size: float,
                  order: int = 1, lumped: bool | None = None, slices: int = 1,
                  identify: bool = True, data_dir=None) -> ModesResult:
    """Normal modes of ``planet`` ("ball", "mars", "prem", "moon") with f in [fmin, fmax].

    Args:
        mesh_size: target edge length relative to the planet's radius.
        order: 1 (P1) or 2 (P2).
        lumped: lumped mass (default for P1, as the benchmarks run; P2 needs consistent).
        slices: spectrum slices of the filtered Lanczos solver.
    """
    from furnace.eigen import SolverConfig, eigsh_interval

    from .assembly import assemble
    from .identify import identify_multiplets
    from .mesh import ball_mesh
    from .models import from_mhz, homogeneous_ball, load_planet, to_mhz

    if not 0 < fmin_mhz < fmax_mhz:
        raise ValueError(f"need 0 < fmin < fmax, got [{fmin_mhz}, {fmax_mhz}] mHz "
                         "(the interval must start above the zero modes)")
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    lumped = (order == 1) if lumped is None else lumped
    model = homogeneous_ball() if planet == "ball" else load_planet(planet, data_dir)
    radius = model.surface_radius
    interfaces = tuple(r for r in (model.fluid_core_radius,) if 0 < r < radius)
    seconds = {}
    t0 = time.perf_counter()
    mesh = ball_mesh(radius, mesh_size * radius, interfaces, order=order)
    seconds["mesh"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    K, M, basis = assemble(mesh, lambda r: model.at(r), order=order, lumped=lumped,
                           return_basis=True)
    seconds["assembly"] = time.perf_counter() - t0
    a, b = float(from_mhz(fmin_mhz)), float(from_mhz(fmax_mhz))
    t0 = time.perf_counter()
    res = eigsh_interval(K, M, a, b, config=SolverConfig(
        a=a, b=b, mass="lumped" if lumped else "consistent"), slices=slices)
    seconds["solve"] = time.perf_counter() - t0
    freqs = np.asarray(to_mhz(res.eigenvalues))
    multiplets = []
    if identify and freqs.size:
        t0 = time.perf_counter()
        multiplets = identify_multiplets(mesh, freqs, res.eigenvectors, basis)
        seconds["identify"] = time.perf_counter() - t0
    return ModesResult(planet, K.shape[0], freqs, multiplets, res.counters, seconds)
