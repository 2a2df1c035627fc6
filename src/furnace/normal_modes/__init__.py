"""Planetary normal modes after Shi et al., SC'18 ("Computing planetary interior normal
modes with a highly parallel polynomial filtering eigensolver").

Submodules are imported on first use so that importing the package never fails because a
sibling module (or an optional dependency such as gmsh or scikit-fem) is missing:

    from furnace.normal_modes import mesh, assembly, identify
    from furnace.normal_modes import compute_modes, ball_mesh, assemble
"""

from __future__ import annotations

import importlib

_SUBMODULES = (
    "assembly", "config", "export", "fluid_solid", "identify", "lamb", "mesh", "models",
    "naive", "plots", "radial", "solve",
)
# the public API: name -> submodule that defines it
_NAMES = {
    "ModesResult": "solve", "compute_modes": "solve", "ModesConfig": "config",
    "naive_split_assembly": "naive", "naive_modes": "naive",
    "TetMesh": "mesh", "ball_mesh": "mesh",
    "assemble": "assembly", "homogeneous": "assembly", "frequencies_mhz": "assembly",
    "SplitDofs": "fluid_solid", "assemble_split": "fluid_solid",
    "RadialModel": "models", "load_planet": "models", "to_mhz": "models", "from_mhz": "models",
    "toroidal_modes": "radial",
    "identify_multiplets": "identify", "identify_mode": "identify",
    "kinetic_fraction": "identify",
    "mode_figure": "plots", "surface_map": "plots", "meridional_section": "plots",
    "write_vtu": "export",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_SUBMODULES, *_NAMES]
