"""Planetary normal modes after Shi et al., SC'18 ("Computing planetary interior normal
modes with a highly parallel polynomial filtering eigensolver").

Submodules are imported on first use so that importing the package never fails because a
sibling module (or an optional dependency such as gmsh or scikit-fem) is missing:

    from furnace.normal_modes import mesh, assembly, identify
"""

from __future__ import annotations

import importlib

_SUBMODULES = (
    "assembly", "export", "identify", "lamb", "mesh", "models", "plots", "radial", "solve",
)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_SUBMODULES)
