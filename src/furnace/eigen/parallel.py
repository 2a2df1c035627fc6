"""Spectrum slicing across MPI ranks (pEVSL's groups of ranks per slice, one rank a group).

Every rank holds the whole pencil, computes the same Jacobi scaling, bounds and KPM slicing
(all deterministic for a fixed seed), solves the slices i with i mod P == rank, and the
ranks all-gather their eigenpairs, which are merged as in the serial solver. This is the
"slices across ranks" mode of Shi et al. (SC'18) and Li et al. (EVSL, section 4). The row
partitioning of one slice over a group of ranks (halo-exchange SpMV, all-reduced inner
products) is not implemented yet.

Run it with ``mpiexec -n P furnace eigen solve A.mtx --mass M.mtx --interval a b``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .config import SolverConfig
from .solver import EigenResult, _merge_duplicates, eigsh_interval


def eigsh_interval_mpi(A, M, a: float, b: float, *, comm=None,
                       config: SolverConfig | None = None, slices: int | None = None,
                       dos_degree: int = 100, dos_vectors: int = 30) -> EigenResult:
    """`eigsh_interval` with the slices spread over the ranks of ``comm``.

    Args:
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        slices: number of slices (default: the number of ranks).
    Returns:
        The same `EigenResult` on every rank (counters are this rank's own work).
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    slices = size if slices is None else slices
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    mine = range(rank, slices, size)
    local = eigsh_interval(A, M, a, b, config=config, slices=slices, dos_degree=dos_degree,
                           dos_vectors=dos_vectors, slice_indices=mine)
    parts = comm.allgather((local.eigenvalues, local.eigenvectors, local.residuals,
                            local.slices))
    values = np.concatenate([p[0] for p in parts])
    vectors = np.concatenate([p[1] for p in parts], axis=1)
    residuals = np.concatenate([p[2] for p in parts])
    infos = sorted((s for p in parts for s in p[3]), key=lambda s: s.a)
    order = np.argsort(values, kind="stable")
    # a pair found by two neighbouring slices: equal value and parallel in the M-inner
    # product (M-orthonormal vectors, so |x_i^T M x_j| ~ 1 for the same pair)
    mass = sp.identity(vectors.shape[0], format="csr") if M is None else M
    values, vectors, residuals = _merge_duplicates(values[order], vectors[:, order],
                                                   residuals[order], mass)
    return EigenResult(eigenvalues=values, eigenvectors=vectors, residuals=residuals,
                       counters=local.counters, slices=infos, lmin=local.lmin,
                       lmax=local.lmax, mass_bounds=local.mass_bounds)
