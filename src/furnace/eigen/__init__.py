"""Sparse symmetric-definite eigensolver: polynomial-filtered Lanczos on an interval.

A Python implementation of pEVSL's ChebLanNr as used by NormalModes (Shi, Li, Xi, Saad,
de Hoop, SC'18; Li, Xi, Erlandson, Saad, "The eigenvalues slicing library (EVSL)", SIAM J.
Sci. Comput. 2019). See README.md for the algorithm and the symbol table.
"""

from furnace.eigen.checks import PencilError, check_pencil
from furnace.eigen.comparison import ComparisonPencil, compare_solvers
from furnace.eigen.config import SolverConfig
from furnace.eigen.dos import DensityOfStates, kpm_dos, slice_spectrum
from furnace.eigen.filters import ChebFilter, damping_factors, find_polynomial
from furnace.eigen.inertia import InertiaCount, InertiaCounter
from furnace.eigen.lanczos import LanczosResult, filtered_lanczos, relative_residuals
from furnace.eigen.naive import naive_eigsh_interval
from furnace.eigen.operators import (
    ChebyshevMassSolve,
    Counters,
    LanczosExtremes,
    LumpedMass,
    ScaledOperator,
    ScaledPencil,
    lanczos_bounds,
    lanczos_extremes,
    scale_pencil,
)
from furnace.eigen.parallel import ParallelLayout, eigsh_interval_mpi
from furnace.eigen.solver import (
    EigenResult,
    IncompleteError,
    SliceInfo,
    SlicePlan,
    eigsh_interval,
    estimate_dos,
    load_pencil,
    plan_slices,
)

__all__ = [
    "ChebFilter",
    "ChebyshevMassSolve",
    "ComparisonPencil",
    "Counters",
    "DensityOfStates",
    "EigenResult",
    "IncompleteError",
    "InertiaCount",
    "InertiaCounter",
    "LanczosExtremes",
    "LanczosResult",
    "LumpedMass",
    "ParallelLayout",
    "PencilError",
    "ScaledOperator",
    "ScaledPencil",
    "SliceInfo",
    "SlicePlan",
    "SolverConfig",
    "check_pencil",
    "compare_solvers",
    "damping_factors",
    "eigsh_interval",
    "eigsh_interval_mpi",
    "estimate_dos",
    "filtered_lanczos",
    "find_polynomial",
    "kpm_dos",
    "lanczos_bounds",
    "lanczos_extremes",
    "load_pencil",
    "naive_eigsh_interval",
    "plan_slices",
    "relative_residuals",
    "scale_pencil",
    "slice_spectrum",
]
