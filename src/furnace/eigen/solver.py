"""`eigsh_interval`: all eigenpairs of A x = lambda M x in [a, b] by filtered Lanczos.

Ties the stages of pEVSL's generalized-problem driver together, as NormalModes runs it (Shi,
Li, Xi, Saad, de Hoop, SC'18, section IV; Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput.
2019, sections 3-4): Jacobi scaling, the mass solver (Chebyshev iteration or lumped), Lanczos
bounds, optional KPM slicing of [a, b], one filter and one filtered Lanczos run per slice, and
the merge of the slices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import scipy.io
import scipy.sparse as sp

from furnace.eigen.config import SolverConfig
from furnace.eigen.dos import kpm_dos, slice_spectrum
from furnace.eigen.filters import find_polynomial
from furnace.eigen.lanczos import filtered_lanczos
from furnace.eigen.operators import Counters, ScaledPencil, scale_pencil


@dataclass
class SliceInfo:
    """What one slice [a, b] of the interval cost and found."""

    a: float
    b: float
    degree: int
    bar: float
    filter_kind: str
    num_steps: int
    num_found: int
    num_candidates: int
    num_rejected: int
    converged: bool


@dataclass
class EigenResult:
    """Eigenpairs of A x = lambda M x in [a, b].

    Attributes:
        eigenvalues: (k,) ascending.
        eigenvectors: (n, k), M-orthonormal (for mass="lumped", orthonormal in the lumped M).
        residuals: (k,) relative residuals ||A x - lambda M x|| / (max(|a|,|b|,|lambda|)
            ||M x||) measured on the Jacobi-scaled pencil.
        counters: work of all stages.
        slices: one `SliceInfo` per slice.
        lmin, lmax: spectrum bounds of the scaled pencil used by the filters.
        mass_bounds: Chebyshev bounds of the scaled M (None when M is diagonal or lumped).
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    counters: Counters = field(default_factory=Counters)
    slices: list[SliceInfo] = field(default_factory=list)
    lmin: float = float("nan")
    lmax: float = float("nan")
    mass_bounds: tuple[float, float] | None = None


def _merge_duplicates(values, vectors, residuals, mass, rel_tol: float = 1e-8):
    """Drop a pair found twice (equal value and parallel in the M~-inner product)."""
    keep = np.ones(values.size, dtype=bool)
    if values.size < 2:
        return values, vectors, residuals
    m_vectors = mass @ vectors
    scale = max(np.max(np.abs(values)), 1e-300)
    for i in range(1, values.size):
        for j in range(i - 1, -1, -1):
            if values[i] - values[j] > rel_tol * scale:
                break
            if keep[j] and abs(vectors[:, j] @ m_vectors[:, i]) > 0.5:
                keep[i] = False
                break
    return values[keep], vectors[:, keep], residuals[keep]


def eigsh_interval(
    A,
    M,
    a: float,
    b: float,
    *,
    config: SolverConfig | None = None,
    slices: int = 1,
    dos_degree: int = 100,
    dos_vectors: int = 30,
    slice_indices=None,
    progress=None,
) -> EigenResult:
    """All eigenpairs of A x = lambda M x with lambda in [a, b].

    Args:
        A: (n, n) symmetric, sparse matrix, dense array or LinearOperator.
        M: (n, n) symmetric positive definite, same kinds; None for the standard problem.
        a, b: the interval; these override config.a and config.b.
        config: `SolverConfig`; None uses the defaults.
        slices: number of slices with equal KPM-estimated counts, one Lanczos run each.
        dos_degree, dos_vectors: KPM degree and probe count, used when slices > 1.
        slice_indices: solve only these slices (the others are skipped); the slicing is
            deterministic, so ranks that split the slices among themselves agree on them.
        progress: optional callable(text), told the slice, filter degree and Lanczos step
            after every step (for a progress display of long solves).
    Returns:
        `EigenResult` with eigenvalues ascending and M-orthonormal eigenvectors.
    Raises:
        ValueError: a >= b, non-square or mismatched A and M, slices < 1, or an interval that
            covers the whole spectrum.
    """
    config = SolverConfig(a=a, b=b) if config is None else dataclasses.replace(config, a=a, b=b)
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    pencil = scale_pencil(A, M, config)
    bounds = _slice_bounds(pencil, config, slices, dos_degree, dos_vectors)
    if bounds is None:
        values, vectors, residuals, infos = _no_pairs(pencil.n)
    else:
        chosen = range(slices) if slice_indices is None else sorted(set(slice_indices))
        values, vectors, residuals, infos = _solve_slices(pencil, config, bounds, chosen,
                                                          progress)
        order = np.argsort(values, kind="stable")
        values, vectors, residuals = _merge_duplicates(
            values[order], vectors[:, order], residuals[order], pencil.mass
        )
    return EigenResult(
        eigenvalues=values,
        eigenvectors=pencil.scaling[:, None] * vectors,
        residuals=residuals,
        counters=pencil.counters,
        slices=infos,
        lmin=pencil.lmin,
        lmax=pencil.lmax,
        mass_bounds=pencil.mass_bounds,
    )


def _no_pairs(n: int):
    return np.zeros(0), np.zeros((n, 0)), np.zeros(0), []


def _slice_bounds(pencil: ScaledPencil, config: SolverConfig, slices: int, dos_degree: int,
                  dos_vectors: int) -> np.ndarray | None:
    """Slice boundaries a = s_0 < ... < s_slices = b, or None if [a, b] misses the spectrum."""
    a, b = config.a, config.b
    if b < pencil.lmin or a > pencil.lmax:
        return None
    if slices == 1:
        return np.array([a, b])
    # slicing only needs [a, b] clipped to the spectrum: outside it the count is zero
    dos = kpm_dos(pencil, degree=dos_degree, num_vectors=dos_vectors, seed=config.seed)
    bounds = slice_spectrum(dos, max(a, pencil.lmin), min(b, pencil.lmax), slices)
    bounds[0], bounds[-1] = a, b
    return bounds


def _solve_slices(pencil: ScaledPencil, config: SolverConfig, bounds: np.ndarray, chosen,
                  progress=None):
    """One filter and one filtered Lanczos run for each slice index in `chosen`.

    Returns:
        (values, vectors, residuals, infos): the pairs of all chosen slices concatenated in
        slice order (not sorted, not merged); vectors are of the scaled pencil, this
        process's rows.
    """
    slices = bounds.size - 1
    values, vectors, residuals, infos = _no_pairs(pencil.n)
    values, vectors, residuals = [values], [vectors], [residuals]
    for i in chosen:
        if not 0 <= i < slices:
            raise ValueError(f"slice index {i} is outside 0..{slices - 1}")
        lo, hi = float(bounds[i]), float(bounds[i + 1])
        poly = find_polynomial(
            lo,
            hi,
            pencil.lmin,
            pencil.lmax,
            thresh_int=config.thresh_int,
            thresh_ext=config.thresh_ext,
            damping=config.damping,
            max_degree=config.max_degree,
        )
        report = None if progress is None else (
            lambda step, i=i, degree=poly.degree: progress(
                f"slice {i + 1}/{slices}, filter degree {degree}, Lanczos step {step}"))
        run = filtered_lanczos(pencil, poly, config, accept_interval=(lo, hi, i == slices - 1),
                               progress=report)
        values.append(run.eigenvalues)
        vectors.append(run.eigenvectors)
        residuals.append(run.residuals)
        infos.append(
            SliceInfo(
                a=lo,
                b=hi,
                degree=poly.degree,
                bar=poly.bar,
                filter_kind=poly.kind,
                num_steps=run.num_steps,
                num_found=run.eigenvalues.size,
                num_candidates=run.num_candidates,
                num_rejected=run.num_rejected,
                converged=run.converged,
            )
        )
    return (np.concatenate(values), np.concatenate(vectors, axis=1), np.concatenate(residuals),
            infos)


def estimate_dos(A, M, *, config: SolverConfig, degree: int = 100, num_vectors: int = 30):
    """KPM density of states of the pencil (A, M) after Jacobi scaling and mass setup.

    Returns:
        (DensityOfStates, Counters).
    """
    pencil = scale_pencil(A, M, config)
    dos = kpm_dos(pencil, degree=degree, num_vectors=num_vectors, seed=config.seed)
    return dos, pencil.counters


def load_pencil(a_path, m_path=None):
    """Read A (and M) from Matrix Market files as CSR matrices; M is None when not given."""
    A = sp.csr_matrix(scipy.io.mmread(a_path))
    M = None if m_path is None else sp.csr_matrix(scipy.io.mmread(m_path))
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"A in {a_path} is not square: {A.shape}")
    if M is not None and M.shape != A.shape:
        raise ValueError(f"M in {m_path} has shape {M.shape}, A has {A.shape}")
    return A, M
