"""Sparse symmetric-definite eigensolver: polynomial-filtered Lanczos on an interval.

A Python implementation of pEVSL's ChebLanNr as used by NormalModes (Shi, Li, Xi, Saad,
de Hoop, SC'18; Li, Xi, Erlandson, Saad, "The eigenvalues slicing library (EVSL)", SIAM J.
Sci. Comput. 2019). See README.md for the algorithm and the symbol table.
"""

from furnace.eigen.config import SolverConfig
from furnace.eigen.dos import DensityOfStates, kpm_dos, slice_spectrum
from furnace.eigen.filters import ChebFilter, damping_factors, find_polynomial
from furnace.eigen.lanczos import LanczosResult, filtered_lanczos, relative_residuals
from furnace.eigen.naive import naive_eigsh_interval
from furnace.eigen.operators import (
    ChebyshevMassSolve,
    Counters,
    LumpedMass,
    ScaledOperator,
    ScaledPencil,
    lanczos_bounds,
    scale_pencil,
)
from furnace.eigen.parallel import ParallelLayout, eigsh_interval_mpi
from furnace.eigen.solver import (
    EigenResult,
    SliceInfo,
    eigsh_interval,
    estimate_dos,
    load_pencil,
)

__all__ = [
    "ChebFilter",
    "ChebyshevMassSolve",
    "Counters",
    "DensityOfStates",
    "EigenResult",
    "LanczosResult",
    "LumpedMass",
    "ParallelLayout",
    "ScaledOperator",
    "ScaledPencil",
    "SliceInfo",
    "SolverConfig",
    "damping_factors",
    "eigsh_interval",
    "eigsh_interval_mpi",
    "estimate_dos",
    "filtered_lanczos",
    "find_polynomial",
    "kpm_dos",
    "lanczos_bounds",
    "load_pencil",
    "naive_eigsh_interval",
    "relative_residuals",
    "scale_pencil",
    "slice_spectrum",
]
