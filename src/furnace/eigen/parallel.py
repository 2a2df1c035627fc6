"""pEVSL's parallel layouts over MPI ranks: slices, rows within a slice, and groups of ranks.

Implements the parallel driver of pEVSL as NormalModes runs it (Shi, Li, Xi, Saad, de Hoop,
SC'18, section IV.D; Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 4;
pEVSL's `TESTS/Lap/LapPLanN.c`): the P ranks are split into P / G groups of G ranks
(``comm.Split(color=rank // G)``); group g solves the slices i of [a, b] with
i mod (P / G) == g, one after another, with the rows of the Jacobi-scaled pencil partitioned
over its G ranks (`furnace.eigen.distributed`: halo-exchange SpMV, all-reduced inner
products). The three modes are the corners of that layout:

* ``"slices"``: G = 1, P groups. Every rank holds the whole scaled pencil and runs the serial
  solver on its slices; no messages until the final gather.
* ``"rows"``: G = P, one group. Every slice is solved by all ranks together.
* ``"groups"``: any G that divides P.

Every group computes the same scaling, spectrum bounds and KPM slicing; world rank 0's slice
boundaries and expected counts are broadcast so that rounding differences between groups can
never open a gap between slices. The inertia factorisations at the slice ends (where used,
see `furnace.eigen.inertia`) are spread over all ranks, one shift each, and all-gathered. At
the end every rank all-gathers its part of its group's eigenvectors and slice reports,
assembles full-length vectors in the original row order (scaled back by D as in the serial
solver), merges pairs that two neighbouring slices both found, and raises `IncompleteError`
alike if some slice could not vouch for its count.

Run with ``mpiexec -n P furnace eigen solve A.mtx --mass M.mtx --interval a b
[--mode slices|rows|groups] [--group-size G] [--slices S]``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .checks import PencilError, check_pencil
from .config import SolverConfig
from .distributed import DistributedSpace, partition_rows
from .operators import Counters, row_sums, scale_pencil
from .solver import (
    EigenResult,
    SlicesPairs,
    _merge_duplicates,
    _solve_slices,
    finish_result,
    inertia_counter,
    plan_slices,
)

MODES = ("slices", "rows", "groups")


@dataclass(frozen=True)
class ParallelLayout:
    """How P ranks share the work: P / group_size groups of group_size ranks each.

    Args:
        mode: "slices" (group_size 1), "rows" (group_size P) or "groups".
        num_ranks: P, the size of the communicator.
        group_size: G; None picks the mode's own (required for "groups").
    Raises:
        ValueError: unknown mode, a group_size the mode does not allow, or one that does not
            divide num_ranks.
    """

    mode: str
    num_ranks: int
    group_size: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        own = {"slices": 1, "rows": self.num_ranks}.get(self.mode)
        if self.group_size is None:
            if own is None:
                raise ValueError('mode "groups" needs a group_size')
            object.__setattr__(self, "group_size", own)
        elif own is not None and self.group_size != own:
            raise ValueError(f'mode "{self.mode}" uses group_size {own} on {self.num_ranks} '
                             f"ranks, got {self.group_size}")
        assert self.group_size is not None  # set above when it was not given
        if self.group_size < 1 or self.num_ranks % self.group_size != 0:
            raise ValueError(f"group_size must divide the {self.num_ranks} ranks, got "
                             f"{self.group_size}")

    @property
    def num_groups(self) -> int:
        assert self.group_size is not None  # __post_init__ sets it
        return self.num_ranks // self.group_size


def eigsh_interval_mpi(A, M, a: float, b: float, *, comm=None,
                       config: SolverConfig | None = None, slices: int | None = None,
                       mode: str = "slices", group_size: int | None = None,
                       dos_degree: int = 100, dos_vectors: int = 30) -> EigenResult:
    """`eigsh_interval` over the ranks of ``comm`` in one of pEVSL's parallel layouts.

    Every rank must pass the same whole pencil and arguments.

    Args:
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        slices: number of slices (default: the number of groups).
        mode: "slices", "rows" or "groups" (see the module docstring).
        group_size: ranks per group; only for mode "groups", where it is required.
        dos_degree, dos_vectors: KPM degree and probe count, used when slices > 1.
    Returns:
        The same eigenvalues, residuals, slices and full-length eigenvectors (original row
        order, M-orthonormal) on every rank; counters are this rank's own work.
    Raises:
        ValueError: on every rank, for a bad layout (see `ParallelLayout`), slices < 1, a
            pencil that cannot be split into group_size row blocks, or what `eigsh_interval`
            raises (`PencilError` included).
        IncompleteError: on every rank, as `eigsh_interval` does.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    layout = ParallelLayout(mode, comm.Get_size(), group_size)
    slices = layout.num_groups if slices is None else slices
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    config = SolverConfig(a=a, b=b) if config is None else dataclasses.replace(config, a=a, b=b)
    # every rank holds the same pencil, so these checks fail on every rank alike
    check_pencil(A, M, mass=config.mass)
    counter = inertia_counter(A, M, config)
    if counter is not None and M is not None:
        _on_rank_zero(comm, counter.check_mass)
    group_size = layout.group_size
    assert group_size is not None  # Layout.__post_init__ sets it
    group = rank // group_size
    counters = Counters()
    group_comm = comm.Split(color=group, key=rank) if group_size > 1 else None
    try:
        pencil = _agreed(comm, lambda: scale_pencil(A, M, config, counters) if group_comm is None
                         else scale_pencil(A, M, config, counters, space=DistributedSpace(
                             group_comm, partition_rows(A, M, group_size), counters)))
        counts = None if counter is None else _spread_counts(
            comm, counter, max(abs(pencil.lmin), abs(pencil.lmax)))
        plan = plan_slices(pencil, config, slices, dos_degree, dos_vectors, counts=counts,
                           share=lambda decide: comm.bcast(decide() if rank == 0 else None))
        found: SlicesPairs | ValueError
        try:
            found = _solve_slices(pencil, config, plan,
                                  range(group, plan.num_slices, layout.num_groups))
        except ValueError as exc:
            # the other groups are about to wait in the gather: tell them instead
            found = exc
    finally:
        if group_comm is not None:
            group_comm.Free()
    payload: str | tuple[Any, ...]
    if isinstance(found, ValueError):
        payload = str(found)
    else:
        values, vectors, residuals, infos = found
        rows = None if group_comm is None else pencil.space.rows
        payload = (group, rows, values, pencil.scaling[:, None] * vectors, residuals, infos)
    parts = comm.allgather(payload)
    failures = [part for part in parts if isinstance(part, str)]
    if failures:
        raise ValueError(failures[0])
    n = pencil.space.size
    groups: dict[int, tuple] = {}
    for g, part_rows, values, vectors, residuals, infos in parts:
        if g not in groups:
            groups[g] = (values, np.empty((n, values.size)), residuals, infos)
        groups[g][1][slice(None) if part_rows is None else part_rows] = vectors
    ordered = [groups[g] for g in sorted(groups)]
    values = np.concatenate([p[0] for p in ordered])
    vectors = np.concatenate([p[1] for p in ordered], axis=1)
    residuals = np.concatenate([p[2] for p in ordered])
    infos = sorted((s for p in ordered for s in p[3]), key=lambda s: s.a)
    order = np.argsort(values, kind="stable")
    values, vectors, residuals = _merge_duplicates(values[order], vectors[:, order],
                                                   residuals[order], _merge_mass(M, config, n))
    result = EigenResult(eigenvalues=values, eigenvectors=vectors, residuals=residuals,
                         counters=counters, slices=infos, lmin=pencil.lmin, lmax=pencil.lmax,
                         mass_bounds=pencil.mass_bounds)
    return finish_result(result, plan, config)


def _on_rank_zero(comm, check) -> None:
    """check() on rank 0 only (a factorisation); its PencilError is raised on every rank."""
    message = None
    if comm.Get_rank() == 0:
        try:
            check()
        except PencilError as exc:
            message = str(exc)
    message = comm.bcast(message)
    if message is not None:
        raise PencilError("M", message)


def _agreed(comm, make):
    """make() on every rank; a PencilError on any rank is raised on all (no rank is left
    waiting in the next collective)."""
    try:
        value, message = make(), None
    except PencilError as exc:
        value, message = None, (exc.matrix, str(exc))
    failures = [m for m in comm.allgather(message) if m is not None]
    if failures:
        raise PencilError(*failures[0])
    return value


def _spread_counts(comm, counter, scale: float):
    """The inertia count of each shift, each factorised by one rank, all-gathered."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def counts(points, outward, steps):
        mine = {}
        for i, (point, direction) in enumerate(zip(points, outward)):
            if i % size == rank:
                try:
                    mine[i] = counter.count_below(float(point), scale=scale, outward=direction,
                                                  steps=steps)
                except (RuntimeError, ValueError, MemoryError):
                    mine[i] = None  # no count from this shift; the slices fall back to DOS
        merged = {}
        for part in comm.allgather(mine):
            merged.update(part)
        return [merged[i] for i in range(len(points))]

    return counts


def _merge_mass(M, config: SolverConfig, n: int):
    """The M the full-length vectors are orthonormal in: M, its lumped diagonal, or I."""
    if M is None:
        return sp.identity(n, format="csr")
    if config.mass == "lumped":
        return sp.diags(row_sums(M)).tocsr()
    return M
