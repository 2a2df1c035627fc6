"""Planetary normal modes after Shi et al., SC'18 ("Computing planetary interior normal
modes with a highly parallel polynomial filtering eigensolver").

    from furnace.normal_modes import mesh, assembly, identify
    from furnace.normal_modes import compute_modes, ball_mesh, assemble

The public names and submodules are plain imports. What stays out of import time, each
inside the function that needs it: the optional dependencies of the ``modes`` extra (gmsh
to mesh, scikit-fem to assemble, meshio to write files), so that the package imports and
its 1-D models run without them, and matplotlib (drawing) and `furnace.eigen` (solving),
which only the calls that draw or solve pay for. Importing the package costs numpy and
scipy.
"""

from __future__ import annotations

from . import (
    assembly,
    config,
    export,
    fluid_solid,
    identify,
    lamb,
    mesh,
    models,
    naive,
    plots,
    radial,
    solve,
)
from .assembly import assemble, frequencies_mhz, homogeneous
from .config import ModesConfig
from .export import write_vtu
from .fluid_solid import SplitDofs, assemble_split
from .identify import identify_mode, identify_multiplets, kinetic_fraction
from .mesh import TetMesh, ball_mesh
from .models import RadialModel, from_mhz, load_planet, to_mhz
from .naive import naive_modes, naive_split_assembly
from .plots import meridional_section, mode_figure, surface_map
from .radial import toroidal_modes
from .solve import ModesResult, compute_modes

__all__ = [
    # submodules
    "assembly", "config", "export", "fluid_solid", "identify", "lamb", "mesh", "models",
    "naive", "plots", "radial", "solve",
    # the public API
    "ModesConfig", "ModesResult", "RadialModel", "SplitDofs", "TetMesh", "assemble",
    "assemble_split", "ball_mesh", "compute_modes", "frequencies_mhz", "from_mhz",
    "homogeneous", "identify_mode", "identify_multiplets", "kinetic_fraction", "load_planet",
    "meridional_section", "mode_figure", "naive_modes", "naive_split_assembly",
    "surface_map", "to_mhz", "toroidal_modes", "write_vtu",
]
