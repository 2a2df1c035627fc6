"""Non-restarted polynomial-filtered Lanczos in the M-inner product (pEVSL ChebLanNr).

Implements Algorithm 1 of Li, Xi, Erlandson, Saad, "The eigenvalues slicing library (EVSL)",
SIAM J. Sci. Comput. 2019 (section 3.2), as called by NormalModes (Shi, Li, Xi, Saad, de Hoop,
SC'18, section IV): Lanczos on p(M^-1 A), keeping both V and Z = M V so that p is applied as
p(A M^-1) to z, with full CGS2 (DGKS) reorthogonalisation, the restricted trace convergence
test, and Rayleigh-quotient acceptance of Ritz pairs inside [a, b]. Every inner product goes
through `pencil.space`, so with rows split over ranks (SC'18 section IV.D) each one is a local
product plus one allreduce, as in pEVSL.

Two additions of this package, for completeness (README.md, "Completeness"): a run may be
*deflated* against pairs already locked (every new Lanczos vector is orthogonalised against
them as well, so a restart from a fresh vector finds the further copies of a repeated
eigenvalue that single-vector Lanczos sees only one of: Parlett, *The Symmetric Eigenvalue
Problem*, 1998, section 13.1), and candidates are taken a little below bar, so that an
eigenvalue sitting on an end of [a, b] (where p equals bar) is not lost to rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.linalg

from furnace.eigen.config import SolverConfig
from furnace.eigen.filters import ChebFilter, Operator
from furnace.eigen.operators import Counters, ScaledPencil, SerialSpace, Space

# counts that the operators and the space add to the pencil's Counters as they work
_OPERATOR_COUNTS = ("a_matvecs", "m_matvecs", "halo_bytes", "halo_messages", "allreduces")
# Ritz values of p down to bar * (1 - CANDIDATE_SLACK) go to the Rayleigh-Ritz step: p = bar
# exactly at a and b, so an eigenvalue on an end converges to bar from either side, and a slice
# also locks the eigenvalues just beyond its ends (up to the shifts its inertia counts used)
CANDIDATE_SLACK = 1e-2


class AcceptInterval(NamedTuple):
    """Rayleigh quotients rho that a run accepts: lo <= rho <= hi if closed_hi, else < hi."""

    lo: float
    hi: float
    closed_hi: bool


class _Accepted(NamedTuple):
    """The Ritz pairs one Rayleigh-Ritz step of a run accepts, and how many it does not."""

    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray
    # Ritz values of p at or above bar * (1 - CANDIDATE_SLACK)
    num_candidates: int
    # candidates inside the interval whose residual has not yet met the tolerance
    num_pending: int


class _LanczosRun(NamedTuple):
    accepted: _Accepted
    converged: bool
    num_steps: int
    basis_v: np.ndarray
    basis_z: np.ndarray


@dataclass
class LanczosResult:
    """Accepted eigenpairs of the scaled pencil from one filtered Lanczos run.

    Attributes:
        eigenvalues: (k,) ascending.
        eigenvectors: (n, k) M~-orthonormal vectors of the scaled pencil (this rank's rows
            with a distributed space).
        residuals: (k,) relative residuals (see `relative_residuals`).
        converged: whether the trace test passed before the step cap.
        num_steps: Krylov dimension reached.
        num_candidates: Ritz values of p at or above bar.
        num_rejected: candidates rejected (Rayleigh quotient outside [a, b] or residual).
        counters: work of this run.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    converged: bool
    num_steps: int
    num_candidates: int
    num_rejected: int
    counters: Counters = field(default_factory=Counters)


def residual_scale(lo: float, hi: float, lmin: float, lmax: float) -> float:
    """max(|a|, |b|) of the interval [lo, hi] clipped to the spectrum [lmin, lmax].

    The scale of the residual test: clipping keeps a huge |a| or |b| from making every
    residual look small (an interval reaching to -1e300 must not accept anything). The floor,
    1e-6 of the spectrum's magnitude, keeps an interval that shrinks to 0 after clipping from
    dividing by zero.
    """
    return max(abs(max(lo, lmin)), abs(min(hi, lmax)), 1e-6 * max(abs(lmin), abs(lmax)))


def relative_residuals(
    a_op: Operator, m_op: Operator, vectors: np.ndarray, values: np.ndarray, scale: float,
    space: Space | None = None,
) -> np.ndarray:
    """||A u - rho M u||_2 / (max(scale, |rho|) ||M u||_2) for each column u.

    The denominator uses the interval scale max(|a|, |b|) rather than |rho| alone, so that
    an eigenvalue near zero inside a wide interval is not held to an impossible standard.
    `space` sums the norms over ranks (default: one process).
    """
    if vectors.shape[1] == 0:
        return np.zeros(0)
    space = SerialSpace(vectors.shape[0]) if space is None else space
    au = a_op @ vectors
    mu = m_op @ vectors
    res = space.norms(au - mu * values)
    denom = np.maximum(scale, np.abs(values)) * space.norms(mu)
    return res / denom


def _rayleigh_ritz(pencil: ScaledPencil, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of (A~, M~) projected on span(basis), M~-orthonormal (exact M~, not M~^-1)."""
    a_basis = pencil.a_op @ basis
    m_basis = pencil.mass @ basis
    a_small = pencil.space.dot(basis, a_basis)
    m_small = pencil.space.dot(basis, m_basis)
    a_small = 0.5 * (a_small + a_small.T)
    m_small = 0.5 * (m_small + m_small.T)
    values, coeffs = scipy.linalg.eigh(a_small, m_small)
    return values, basis @ coeffs


def _lanczos_steps(pencil: ScaledPencil, poly: ChebFilter, config: SolverConfig,
                   filtered: Callable[[np.ndarray], np.ndarray],
                   deflate: Callable[[np.ndarray], None], basis_v: np.ndarray,
                   basis_z: np.ndarray, max_steps: int, accept_interval: AcceptInterval,
                   scale: float, counters: Counters,
                   progress: Callable[[int], None] | None) -> _LanczosRun:
    """The Lanczos loop of `filtered_lanczos` from a normalised start (column 0 of the bases);
    the bases come back grown to the Krylov dimension reached."""
    space = pencil.space
    n = pencil.n
    lo, hi, closed_hi = accept_interval
    alphas: list[float] = []
    betas: list[float] = []
    trace_prev = np.inf
    converged = False
    bar = poly.bar
    accepted: _Accepted | None = None

    def accept(num: int) -> _Accepted:
        ritz, coeffs = scipy.linalg.eigh_tridiagonal(np.array(alphas), np.array(betas[: num - 1]))
        wanted = ritz >= bar * (1.0 - CANDIDATE_SLACK)
        if not np.any(wanted):
            return _Accepted(np.zeros(0), np.zeros((n, 0)), np.zeros(0), 0, 0)
        ritz_vectors = basis_v[:, :num] @ coeffs[:, wanted]
        values, vectors = _rayleigh_ritz(pencil, ritz_vectors)
        inside = (values >= lo) & ((values <= hi) if closed_hi else (values < hi))
        res = relative_residuals(pencil.a_op, pencil.mass, vectors, values, scale, space)
        good = inside & (res <= config.tol)
        # candidates inside [a, b] that fail the residual test mean "not yet converged"
        pending = int(np.sum(inside & ~good))
        return _Accepted(values[good], vectors[:, good], res[good], int(wanted.sum()), pending)

    num = 1
    for j in range(max_steps):
        z_new = filtered(basis_z[:, j])
        if j > 0:
            z_new -= betas[-1] * basis_z[:, j - 1]
        alpha = float(space.dot(basis_v[:, j], z_new))
        z_new -= alpha * basis_z[:, j]
        # CGS2: the M~^-1-inner products of w = M~^-1 z_new with v_i are v_i^T z_new
        for _ in range(2):
            z_new -= basis_z[:, : j + 1] @ space.dot(basis_v[:, : j + 1], z_new)
            deflate(z_new)
        counters.reorth_flops += 8 * n * (j + 1)
        alphas.append(alpha)
        num = j + 1
        counters.lanczos_steps = num
        if progress is not None:
            progress(num)
        v_new = pencil.mass.solve(z_new)
        beta = float(np.sqrt(max(space.dot(v_new, z_new), 0.0)))
        invariant = beta <= 1e-13 * max(abs(alpha), 1.0)
        step = j + 1
        check = step >= config.min_steps and (step - config.min_steps) % config.check_every == 0
        if check or invariant or step == max_steps:
            ritz = scipy.linalg.eigvalsh_tridiagonal(np.array(alphas), np.array(betas))
            trace = float(ritz[ritz >= bar].sum())
            if abs(trace - trace_prev) < config.trace_tol or invariant:
                accepted = accept(num)
                if accepted.num_pending == 0 or invariant:
                    converged = True
                    break
            trace_prev = trace
        if invariant or step == max_steps:
            break
        betas.append(beta)
        if step >= basis_v.shape[1]:
            grow = min(2 * basis_v.shape[1], max_steps + 1)
            basis_v = np.concatenate([basis_v, np.empty((n, grow - basis_v.shape[1]))], axis=1)
            basis_z = np.concatenate([basis_z, np.empty((n, grow - basis_z.shape[1]))], axis=1)
        counters.peak_basis_bytes = max(counters.peak_basis_bytes, basis_v.nbytes + basis_z.nbytes)
        basis_v[:, step] = v_new / beta
        basis_z[:, step] = z_new / beta
    if accepted is None or not converged:
        accepted = accept(num)
    return _LanczosRun(accepted, converged, num, basis_v, basis_z)


def filtered_lanczos(
    pencil: ScaledPencil,
    poly: ChebFilter,
    config: SolverConfig,
    *,
    accept_interval: AcceptInterval | None = None,
    progress: Callable[[int], None] | None = None,
    locked: tuple[np.ndarray, np.ndarray] | None = None,
    seed: int | None = None,
) -> LanczosResult:
    """Eigenpairs of the scaled pencil in [a, b] by Lanczos on p(M~^-1 A~).

    Args:
        pencil: the Jacobi-scaled pencil with its mass solver (`scale_pencil`).
        poly: the filter for [a, b] (`find_polynomial`).
        config: the solver's settings; a run reads tol, trace_tol, check_every, min_steps,
            max_lanczos_steps and seed.
        accept_interval: accept rho in [lo, hi] if closed_hi else [lo, hi); used by
            spectrum slicing so that neighbouring slices do not both
            report an eigenvalue on their common boundary. Default [poly.a, poly.b].
        progress: optional callable(step), told the Krylov dimension after every step.
        locked: (V, M~ V) of pairs found before, M~-orthonormal (this rank's rows): the run
            is deflated against them and returns only new pairs.
        seed: seed of the random start vector (default config.seed).
    Returns:
        `LanczosResult`; counters are also merged into pencil.counters.
    """
    counters = Counters()
    space = pencil.space
    n = pencil.n
    lo, hi, closed_hi = accept_interval or AcceptInterval(poly.a, poly.b, True)
    locked_v, locked_z = (np.zeros((n, 0)), np.zeros((n, 0))) if locked is None else locked
    num_locked = locked_v.shape[1]
    # the Krylov dimension is bounded by the global n (less the locked pairs: the deflated
    # space is that much smaller), so every rank stops at the same step
    max_steps = config.max_lanczos_steps or min(space.size, 2000)
    max_steps = min(max_steps, space.size - num_locked)
    before = dataclasses.replace(pencil.counters)
    operator = pencil.filter_operator()
    scale = residual_scale(lo, hi, pencil.lmin, pencil.lmax)

    def filtered(z: np.ndarray) -> np.ndarray:
        return poly.apply(operator, z, counters)

    def deflate(z: np.ndarray) -> None:
        # the M~^-1-inner products of M~^-1 z with the locked v_i are v_i^T z
        if num_locked:
            z -= locked_z @ space.dot(locked_v, z)
            counters.reorth_flops += 4 * n * num_locked

    accepted = _Accepted(np.zeros(0), np.zeros((n, 0)), np.zeros(0), 0, 0)
    converged, num = True, 0
    basis_v = basis_z = np.empty((n, 0))
    if max_steps >= 1:
        rng = np.random.default_rng(config.seed if seed is None else seed)
        z = filtered(pencil.mass @ space.restrict(rng.standard_normal(space.size)))
        for _ in range(2):
            deflate(z)
        v = pencil.mass.solve(z)
        norm = float(np.sqrt(max(space.dot(v, z), 0.0)))
        # a start vector the filter and the deflation annihilate: nothing left to find
        if norm > 0.0:
            basis_v = np.empty((n, min(max_steps + 1, 64)))
            basis_z = np.empty_like(basis_v)
            basis_v[:, 0], basis_z[:, 0] = v / norm, z / norm
            accepted, converged, num, basis_v, basis_z = _lanczos_steps(
                pencil, poly, config, filtered, deflate, basis_v, basis_z, max_steps,
                AcceptInterval(lo, hi, closed_hi), scale, counters, progress)
    values, vectors, res = accepted.values, accepted.vectors, accepted.residuals
    num_candidates = accepted.num_candidates
    counters.peak_basis_bytes = max(counters.peak_basis_bytes, basis_v.nbytes + basis_z.nbytes)
    shared = pencil.counters
    for name in _OPERATOR_COUNTS:
        setattr(counters, name, getattr(shared, name) - getattr(before, name))
    shared.filtered_matvecs += counters.filtered_matvecs
    shared.filter_degree = max(shared.filter_degree, counters.filter_degree)
    shared.lanczos_steps += counters.lanczos_steps
    shared.reorth_flops += counters.reorth_flops
    shared.peak_basis_bytes = max(shared.peak_basis_bytes, counters.peak_basis_bytes)
    order = np.argsort(values)
    return LanczosResult(
        eigenvalues=values[order],
        eigenvectors=vectors[:, order],
        residuals=res[order],
        converged=converged,
        num_steps=num,
        num_candidates=num_candidates,
        num_rejected=num_candidates - len(values),
        counters=counters,
    )
