"""`eigsh_interval`: all eigenpairs of A x = lambda M x in [a, b] by filtered Lanczos.

Ties the stages of pEVSL's generalized-problem driver together, as NormalModes runs it (Shi,
Li, Xi, Saad, de Hoop, SC'18, section IV; Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput.
2019, sections 3-4): Jacobi scaling, the mass solver (Chebyshev iteration or lumped), Lanczos
bounds, KPM slicing of [a, b], one filter and filtered Lanczos runs per slice, and the merge of
the slices.

On top of pEVSL, which trusts its trace test, the solver vouches for the number of eigenvalues
it returns (README.md, "Completeness"): every slice's count is checked against Sylvester's
inertia (exact; `furnace.eigen.inertia`) or the KPM estimate with its stated tolerance
(`DensityOfStates.count_tolerance`); a slice found short is restarted from a fresh vector,
deflated against the pairs already locked, which also finds the copies of repeated eigenvalues
a single Lanczos vector cannot see; an interval estimated to hold more than one slice can take
is sliced further. A solve that cannot vouch for its count raises `IncompleteError` (or, with
``allow_incomplete``, says so in `EigenResult.complete` and per slice).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np
import scipy.io
import scipy.linalg
import scipy.sparse as sp

from furnace.eigen.checks import PencilError, check_pencil
from furnace.eigen.config import SolverConfig
from furnace.eigen.dos import DensityOfStates, kpm_dos, slice_spectrum
from furnace.eigen.filters import END_TOL, Operator, find_polynomial
from furnace.eigen.inertia import END_STEPS, INNER_STEPS, InertiaCount, InertiaCounter
from furnace.eigen.lanczos import (
    AcceptInterval,
    _rayleigh_ritz,
    filtered_lanczos,
    relative_residuals,
    residual_scale,
)
from furnace.eigen.operators import Counters, ScaledPencil, scale_pencil

# eigenvalues within BOUNDARY_MARGIN * tol * (spectrum scale) of a slice end may be counted
# on either side of it (a Rayleigh quotient with residual tol is that close to an eigenvalue)
BOUNDARY_MARGIN = 10.0


@dataclass
class SliceInfo:
    """What one slice [a, b) of the interval (the last one closed) cost and found.

    Attributes:
        expected: the count the slice is checked against: exact for count_method "inertia"
            (less any eigenvalues found between a factorised shift and the slice's end,
            which the slice does not report), the KPM estimate for "dos", 0 for "bounds"
            (the slice misses the spectrum bounds).
        tolerance: how far num_found may be from expected (0 for "inertia", where only
            eigenvalues within the boundary margin of an end may fall either way).
        restarts: deflated restarts after the first run.
        converged: the last Lanczos run stopped on its trace and residual test, not on the
            step cap.
        complete: the count is vouched for (see `EigenResult.complete`).
        message: why not, when not complete.
    """

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
    expected: float = float("nan")
    tolerance: float = float("nan")
    count_method: str = ""
    restarts: int = 0
    complete: bool = False
    message: str = ""


@dataclass
class EigenResult:
    """Eigenpairs of A x = lambda M x in [a, b].

    Attributes:
        eigenvalues: (k,) ascending: those in [a, b], where an eigenvalue within the boundary
            margin (BOUNDARY_MARGIN * tol * max(|lmin|, |lmax|)) of a or b counts as inside.
        eigenvectors: (n, k), M-orthonormal (for mass="lumped", orthonormal in the lumped M).
        residuals: (k,) relative residuals ||A x - lambda M x|| / (max(s, |lambda|) ||M x||)
            on the Jacobi-scaled pencil, s = max(|a|, |b|) of [a, b] clipped to the spectrum.
        counters: work of all stages.
        slices: one `SliceInfo` per slice.
        lmin, lmax: spectrum bounds of the scaled pencil used by the filters.
        mass_bounds: Chebyshev bounds of the scaled M (None when M is diagonal or lumped).
        complete: every slice's count is vouched for: with count_method "inertia" the number
            found equals Sylvester's count (up to eigenvalues within the boundary margin of a
            slice end); with "dos" it lies within the KPM estimate's tolerance and a deflated
            run from a fresh vector found nothing more.
        message: why the result is not complete ("" when it is).
        expected: the total count the slices were checked against.
        count_method: "inertia", "dos", "dense" (the dense reference), or a mix "inertia+dos"
            when some slice ends could not be factorised reliably.
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    residuals: np.ndarray
    counters: Counters = field(default_factory=Counters)
    slices: list[SliceInfo] = field(default_factory=list)
    lmin: float = float("nan")
    lmax: float = float("nan")
    mass_bounds: tuple[float, float] | None = None
    complete: bool = False
    message: str = ""
    expected: float = float("nan")
    count_method: str = ""

    @property
    def converged(self) -> bool:
        """Every slice's last Lanczos run stopped on its convergence test."""
        return all(s.converged for s in self.slices)


class IncompleteError(RuntimeError):
    """The solver could not vouch for the number of eigenvalues it found.

    Attributes:
        result: the `EigenResult` with what was found (complete is False).
    """

    def __init__(self, message: str, result: EigenResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class SlicePlan:
    """The slices of [a, b] and the count each one is checked against.

    Attributes:
        bounds: a = s_0 < ... < s_S = b.
        methods: per slice, "inertia", "dos" or "bounds".
        expected, tolerance: per slice (see `SliceInfo`).
        points, below: per boundary, the shift factorised (nan where none) and the number
            of eigenvalues below it (-1 where none).
        margin: the boundary margin: eigenvalues this close to an end may fall either way,
            and pairs this far beyond a slice's ends are locked (but not reported) by it.
        dos: the KPM estimate, when one was computed.
    """

    bounds: np.ndarray
    methods: list[str]
    expected: np.ndarray
    tolerance: np.ndarray
    points: np.ndarray
    below: np.ndarray
    margin: float
    dos: DensityOfStates | None = None

    @property
    def num_slices(self) -> int:
        return int(self.bounds.size - 1)

    def window(self, i: int) -> tuple[float, float]:
        """The values slice i locks: its ends (and factorised shifts) widened by the margin."""
        lo, hi = float(self.bounds[i]), float(self.bounds[i + 1])
        points = [p for p in self.points[i : i + 2] if np.isfinite(p)]
        return (min([lo, *points]) - self.margin, max([hi, *points]) + self.margin)


class Pairs(NamedTuple):
    """Eigenpairs with their relative residuals; vectors are the columns."""

    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray


class SlicePairs(NamedTuple):
    """What one slice reports: its pairs (vectors of the scaled pencil, this process's rows)
    and its `SliceInfo`."""

    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray
    info: SliceInfo


class SlicesPairs(NamedTuple):
    """The pairs of several slices concatenated in slice order (not sorted, not merged), and
    one `SliceInfo` per slice."""

    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray
    infos: list[SliceInfo]


class DosEstimate(NamedTuple):
    """`estimate_dos`'s result: the density of states and the work it took."""

    dos: DensityOfStates
    counters: Counters


# counts(points, outward, steps): the inertia counts below each point (see `plan_slices`)
CountFunction = Callable[[Iterable[float], Iterable[float], "tuple[float, ...]"],
                         "list[InertiaCount | None]"]
_Shared = TypeVar("_Shared")


def _merge_duplicates(values: np.ndarray, vectors: np.ndarray, residuals: np.ndarray,
                      mass: Operator, rel_tol: float = 1e-8) -> Pairs:
    """Drop a pair found twice (equal value and parallel in the M~-inner product)."""
    keep = np.ones(values.size, dtype=bool)
    if values.size < 2:
        return Pairs(values, vectors, residuals)
    m_vectors = mass @ vectors
    scale = max(np.max(np.abs(values)), 1e-300)
    for i in range(1, values.size):
        for j in range(i - 1, -1, -1):
            if values[i] - values[j] > rel_tol * scale:
                break
            if keep[j] and abs(vectors[:, j] @ m_vectors[:, i]) > 0.5:
                keep[i] = False
                break
    return Pairs(values[keep], vectors[:, keep], residuals[keep])


def is_explicit(op: Operator | None) -> bool:
    """A sparse matrix or a dense array (factorisable), not a LinearOperator."""
    return op is None or sp.issparse(op) or isinstance(op, np.ndarray)


def inertia_counter(A: Operator, M: Operator | None,
                    config: SolverConfig) -> InertiaCounter | None:
    """The `InertiaCounter` that config.count_check asks for, or None (count by DOS).

    Raises:
        ValueError: count_check="inertia" with A or M given as a LinearOperator.
    """
    explicit = is_explicit(A) and is_explicit(M)
    if config.count_check == "dos":
        return None
    if config.count_check == "inertia":
        if not explicit:
            raise ValueError("count_check='inertia' needs A and M as sparse matrices or arrays, "
                             "not LinearOperators")
        return InertiaCounter(A, M, mass=config.mass)
    if explicit and A.shape[0] <= config.inertia_max_n:
        return InertiaCounter(A, M, mass=config.mass)
    return None


def _here(decide: Callable[[], _Shared]) -> _Shared:
    return decide()


def _serial_counts(counter: InertiaCounter, scale: float) -> CountFunction:
    def counts(points: Iterable[float], outward: Iterable[float],
               steps: tuple[float, ...]) -> list[InertiaCount | None]:
        return [counter.count_below(float(p), scale=scale, outward=o, steps=steps)
                for p, o in zip(points, outward)]

    return counts


def slice_capacity(config: SolverConfig, n: int) -> int:
    """Most eigenvalues one slice takes: config.slice_capacity, else a quarter of the Lanczos
    step cap (pEVSL's drivers size the Krylov space at about 4 times the count)."""
    if config.slice_capacity is not None:
        return config.slice_capacity
    steps = config.max_lanczos_steps or min(n, 2000)
    return max(1, min(steps, n) // 4)


def plan_slices(pencil: ScaledPencil, config: SolverConfig, slices: int, dos_degree: int,
                dos_vectors: int, *, counts: CountFunction | None = None,
                share: Callable[[Callable[[], Any]], Any] = _here) -> SlicePlan:
    """Slice [a, b] into at least ``slices`` pieces with their expected counts.

    Args:
        counts: callable(points, outward, steps) -> [InertiaCount or None] (see
            `InertiaCounter.count_below`); None counts by the KPM estimate. Under MPI it
            is collective (every rank passes the same points).
        share: callable(decide) -> world rank 0's decide() on every rank (decide() itself on
            one process): the slicing and the expected counts are decided once, from rank
            0's estimate, so that all groups cut [a, b] alike.
    """
    a, b = config.a, config.b
    lmin, lmax = pencil.lmin, pencil.lmax
    scale = max(abs(lmin), abs(lmax))
    margin = BOUNDARY_MARGIN * config.tol * scale
    center, half_width = 0.5 * (lmax + lmin), 0.5 * (lmax - lmin)
    meets = not (b < lmin or a > lmax)
    covers = (a - center) / half_width <= -1.0 + END_TOL and (b - center) / half_width >= (
        1.0 - END_TOL)
    ends = counts([a, b], [-1.0, 1.0], END_STEPS) if counts is not None else [None, None]
    # the exact number of eigenvalues in [a, b] when both ends were counted by inertia
    exact_total = (ends[1].below - ends[0].below
                   if ends[0] is not None and ends[1] is not None else None)
    exact = exact_total is not None
    capacity = slice_capacity(config, pencil.space.size)
    dos: DensityOfStates | None = None
    need_dos = meets and (exact_total is None or slices > 1 or covers
                          or exact_total > capacity)
    if need_dos:
        dos = kpm_dos(pencil, degree=dos_degree, num_vectors=dos_vectors, seed=config.seed)
    lo_clip, hi_clip = max(a, lmin), min(b, lmax)

    def decide() -> np.ndarray:
        if not meets:
            return np.linspace(a, b, slices + 1)
        # need_dos held unless the count is exact and one slice takes it all
        if exact_total is None:
            assert dos is not None
            total = dos.count(lo_clip, hi_clip)
        else:
            total = exact_total
        num = max(slices, math.ceil(total / capacity), 2 if covers else 1)
        if num == 1:
            return np.array([a, b])
        assert dos is not None
        bounds = slice_spectrum(dos, lo_clip, hi_clip, num)
        bounds[0], bounds[-1] = a, b
        return bounds

    bounds = np.asarray(share(decide), dtype=float)
    num = bounds.size - 1
    inner = (counts(bounds[1:-1], [-1.0] * (num - 1), INNER_STEPS)
             if counts is not None and exact and num > 1 else [])
    found = [ends[0], *inner, ends[1]] if exact else [None] * (num + 1)
    points = np.array([np.nan if c is None else c.sigma for c in found])
    below = np.array([-1 if c is None else c.below for c in found])
    if exact and any(c is None for c in inner) and dos is None:
        dos = kpm_dos(pencil, degree=dos_degree, num_vectors=dos_vectors, seed=config.seed)

    def expectations() -> tuple[list[str], list[float], list[float]]:
        methods, expected, tolerance = [], [], []
        for i in range(num):
            lo, hi = float(bounds[i]), float(bounds[i + 1])
            if below[i] >= 0 and below[i + 1] >= 0:
                methods.append("inertia")
                expected.append(float(below[i + 1] - below[i]))
                tolerance.append(0.0)
            elif hi < lmin or lo > lmax or dos is None:
                methods.append("bounds")
                expected.append(0.0)
                tolerance.append(0.0)
            else:
                lo_c, hi_c = max(lo, lmin), min(hi, lmax)
                methods.append("dos")
                expected.append(dos.count(lo_c, hi_c))
                tolerance.append(dos.count_tolerance(lo_c, hi_c))
        return methods, expected, tolerance

    methods, expected, tolerance = share(expectations)
    return SlicePlan(bounds, list(methods), np.array(expected), np.array(tolerance), points,
                     below, margin, dos)


def _count_status(plan: SlicePlan, i: int, values: np.ndarray, reported: int) -> str:
    """"ok", "short" or "over": the slice's locked values against its expected count."""
    method, expected = plan.methods[i], plan.expected[i]
    if method == "inertia":
        lo, hi, eta = plan.points[i], plan.points[i + 1], plan.margin
        sure = int(np.count_nonzero((values >= lo + eta) & (values < hi - eta)))
        maybe = int(np.count_nonzero((values >= lo - eta) & (values < hi + eta)))
        if expected > maybe:
            return "short"
        return "over" if expected < sure else "ok"
    tolerance = plan.tolerance[i]
    if reported < expected - tolerance:
        return "short"
    return "over" if reported > expected + tolerance else "ok"


def _skipped_slice(plan: SlicePlan, i: int, n: int, message: str = "") -> SlicePairs:
    lo, hi = float(plan.bounds[i]), float(plan.bounds[i + 1])
    info = SliceInfo(a=lo, b=hi, degree=0, bar=float("nan"), filter_kind="none", num_steps=0,
                     num_found=0, num_candidates=0, num_rejected=0, converged=not message,
                     expected=float(plan.expected[i]), tolerance=float(plan.tolerance[i]),
                     count_method=plan.methods[i], complete=not message, message=message)
    return SlicePairs(np.zeros(0), np.zeros((n, 0)), np.zeros(0), info)


def _solve_slice(pencil: ScaledPencil, config: SolverConfig, plan: SlicePlan, i: int,
                 progress: Callable[[str], None] | None = None) -> SlicePairs:
    """One filter and Lanczos runs (the first, then deflated restarts) for slice i.

    Returns:
        the pairs slice i reports (its [a, b), the last slice's closed).
    """
    slices = plan.num_slices
    lo, hi = float(plan.bounds[i]), float(plan.bounds[i + 1])
    last = i == slices - 1
    method, expected = plan.methods[i], float(plan.expected[i])
    n = pencil.n
    if method in ("inertia", "bounds") and expected == 0:
        return _skipped_slice(plan, i, n)  # certified (or, outside the bounds, taken) empty
    try:
        poly = find_polynomial(lo, hi, pencil.lmin, pencil.lmax, thresh_int=config.thresh_int,
                               thresh_ext=config.thresh_ext, damping=config.damping,
                               max_degree=config.max_degree)
    except ValueError as exc:
        return _skipped_slice(plan, i, n, f"slice {i + 1}/{slices} [{lo:.6g}, {hi:.6g}]: "
                              f"{exc}")
    window = plan.window(i)
    # slices report [s_i, s_i+1) (the last one closed); the outer ends a and b are widened by
    # the margin, so that an eigenvalue on a or b that rounding puts just outside is kept
    kept = (lo - plan.margin if i == 0 else lo, hi + plan.margin if last else hi, last)
    locked_v, locked_z, locked_values = np.zeros((n, 0)), np.zeros((n, 0)), np.zeros(0)
    restarts = steps = candidates = rejected = 0
    while True:
        report: Callable[[int], None] | None = None if progress is None else (
            lambda step, r=restarts: progress(
                f"slice {i + 1}/{slices}, filter degree {poly.degree}"
                + (f", restart {r}" if r else "") + f", Lanczos step {step}"))
        # the first run starts from config.seed, as pEVSL does; restarts from fresh vectors
        seed = config.seed if restarts == 0 else config.seed + 1_000_003 * restarts + 7919 * i
        run = filtered_lanczos(pencil, poly, config,
                               accept_interval=AcceptInterval(*window, True),
                               progress=report, seed=seed,
                               locked=(locked_v, locked_z) if locked_values.size else None)
        steps += run.num_steps
        candidates += run.num_candidates
        rejected += run.num_rejected
        new = run.eigenvalues.size
        if new:
            locked_v = np.concatenate([locked_v, run.eigenvectors], axis=1)
            locked_z = np.concatenate([locked_z, pencil.mass @ run.eigenvectors], axis=1)
            locked_values = np.concatenate([locked_values, run.eigenvalues])
        reported = int(np.count_nonzero(_inside(locked_values, *kept)))
        status = _count_status(plan, i, locked_values, reported)
        # with an exact count, stop once it is met; with an estimate, only a deflated run
        # from a fresh vector that finds nothing new ends the search
        done = status != "short" if method == "inertia" else False
        if done or new == 0 or restarts >= config.max_restarts:
            break
        restarts += 1
    values, vectors = locked_values, locked_v
    if restarts and values.size > 1:
        # runs are M~-orthogonal only to the accuracy of the mass solve: one Rayleigh-Ritz
        # step on all locked vectors makes them M~-orthonormal to working precision (unless
        # two are parallel, which the final merge of duplicates then sorts out)
        try:
            values, vectors = _rayleigh_ritz(pencil, vectors)
        except scipy.linalg.LinAlgError:
            pass
    scale = residual_scale(window[0], window[1], pencil.lmin, pencil.lmax)
    residuals = relative_residuals(pencil.a_op, pencil.mass, vectors, values, scale,
                                   pencil.space)
    keep = _inside(values, *kept) & (residuals <= config.tol)
    reported = int(np.count_nonzero(keep))
    good = values[residuals <= config.tol]
    status = _count_status(plan, i, good, reported)
    verified = method == "inertia" or (new == 0 and run.converged)
    complete = status == "ok" and verified
    if method == "inertia" and status == "ok":
        # the factorised shifts sit a little outside the slice's ends: the eigenvalues found
        # between a shift and an end are counted by the inertia but not reported here
        between = (good >= plan.points[i]) & (good < plan.points[i + 1]) & ~_inside(good, *kept)
        expected -= float(np.count_nonzero(between))
    message = "" if complete else _incomplete_message(plan, i, reported, status, restarts,
                                                      run.converged, new)
    info = SliceInfo(a=lo, b=hi, degree=poly.degree, bar=poly.bar, filter_kind=poly.kind,
                     num_steps=steps, num_found=reported, num_candidates=candidates,
                     num_rejected=rejected, converged=run.converged, expected=expected,
                     tolerance=float(plan.tolerance[i]), count_method=method,
                     restarts=restarts, complete=complete, message=message)
    return SlicePairs(values[keep], vectors[:, keep], residuals[keep], info)


def _inside(values: np.ndarray, lo: float, hi: float, closed: bool) -> np.ndarray:
    """lo <= values < hi, or <= hi when closed."""
    return (values >= lo) & ((values <= hi) if closed else (values < hi))


def _incomplete_message(plan: SlicePlan, i: int, found: int, status: str, restarts: int,
                        converged: bool, new: int) -> str:
    lo, hi = plan.bounds[i], plan.bounds[i + 1]
    method, expected, tolerance = plan.methods[i], plan.expected[i], plan.tolerance[i]
    where = f"slice {i + 1}/{plan.num_slices} [{lo:.6g}, {hi:.6g}]"
    if method == "inertia":
        count = f"Sylvester's inertia count is {int(expected)}"
    else:
        count = f"the KPM estimate is {expected:.1f} +- {tolerance:.1f}"
    if status != "ok":
        why = f"found {found} eigenvalues but {count}"
    else:
        if new and restarts == 0:
            last = "no deflated rerun (max_restarts is 0) confirmed that nothing is left"
        elif new:
            last = f"the last deflated rerun still found {new} new ones"
        else:
            last = "the last deflated rerun stopped at the step cap"
        why = f"found {found} eigenvalues ({count}) but {last}"
    return (f"{where}: {why}, after {restarts} restart(s)"
            + ("" if converged else "; the last Lanczos run hit max_lanczos_steps"))


def _solve_slices(pencil: ScaledPencil, config: SolverConfig, plan: SlicePlan,
                  chosen: Iterable[int],
                  progress: Callable[[str], None] | None = None) -> SlicesPairs:
    """`_solve_slice` for each slice index in `chosen`, in that order."""
    values, vectors, residuals = [np.zeros(0)], [np.zeros((pencil.n, 0))], [np.zeros(0)]
    infos: list[SliceInfo] = []
    for i in chosen:
        if not 0 <= i < plan.num_slices:
            raise ValueError(f"slice index {i} is outside 0..{plan.num_slices - 1}")
        found = _solve_slice(pencil, config, plan, i, progress)
        values.append(found.values)
        vectors.append(found.vectors)
        residuals.append(found.residuals)
        infos.append(found.info)
    return SlicesPairs(np.concatenate(values), np.concatenate(vectors, axis=1),
                       np.concatenate(residuals),
            infos)


def finish_result(result: EigenResult, plan: SlicePlan, config: SolverConfig) -> EigenResult:
    """Set complete, message, expected and count_method; raise `IncompleteError` unless
    complete or config.allow_incomplete.

    With slice_indices only the slices solved are in result.slices, and complete and
    expected speak for those.
    """
    messages = [s.message for s in result.slices if not s.complete]
    result.complete = not messages
    result.message = "; ".join(messages)
    result.expected = float(np.sum([s.expected for s in result.slices]))
    methods = sorted({m for m in plan.methods if m != "bounds"}) or ["bounds"]
    result.count_method = "+".join(methods)
    if not result.complete and not config.allow_incomplete:
        raise IncompleteError(f"the eigensolver cannot vouch for the count in [{config.a:g}, "
                              f"{config.b:g}]: {result.message}", result)
    return result


def prepare_pencil(A: Operator, M: Operator | None,
                   config: SolverConfig) -> InertiaCounter | None:
    """Check the pencil (`check_pencil`, and M's definiteness by LDL^T where the inertia is
    used) and return the inertia counter config asks for."""
    check_pencil(A, M, mass=config.mass)
    counter = inertia_counter(A, M, config)
    if counter is not None and M is not None:
        counter.check_mass()
    return counter


def eigsh_interval(
    A: Operator,
    M: Operator | None,
    a: float,
    b: float,
    *,
    config: SolverConfig | None = None,
    slices: int = 1,
    dos_degree: int = 100,
    dos_vectors: int = 30,
    slice_indices: Iterable[int] | None = None,
    progress: Callable[[str], None] | None = None,
) -> EigenResult:
    """All eigenpairs of A x = lambda M x with lambda in [a, b], or an error saying it could
    not find them all.

    Args:
        A: (n, n) symmetric, sparse matrix, dense array or LinearOperator.
        M: (n, n) symmetric positive definite, same kinds; None for the standard problem.
        a, b: the interval; these override config.a and config.b.
        config: `SolverConfig`; None uses the defaults.
        slices: least number of slices with equal KPM-estimated counts, one filter each;
            more are made when the interval holds more than `slice_capacity` eigenvalues
            (and at least 2 when [a, b] covers the whole spectrum).
        dos_degree, dos_vectors: KPM degree and probe count.
        slice_indices: solve only these slices (the others are skipped); the slicing is
            deterministic, so ranks that split the slices among themselves agree on them.
        progress: optional callable(text), told the slice, filter degree and Lanczos step
            after every step (for a progress display of long solves).
    Returns:
        `EigenResult` with eigenvalues ascending, M-orthonormal eigenvectors and a per-slice
        report of the expected and found counts.
    Raises:
        PencilError: A or M not real, finite, symmetric, square and matching, or M not
            positive definite (a ValueError).
        ValueError: a >= b, an infinite end, slices < 1.
        IncompleteError: the count could not be vouched for (unless
            config.allow_incomplete); its .result holds what was found.
    """
    config = SolverConfig(a=a, b=b) if config is None else dataclasses.replace(config, a=a, b=b)
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    counter = prepare_pencil(A, M, config)
    pencil = scale_pencil(A, M, config)
    counts = None if counter is None else _serial_counts(counter, max(abs(pencil.lmin),
                                                                      abs(pencil.lmax)))
    plan = plan_slices(pencil, config, slices, dos_degree, dos_vectors, counts=counts)
    chosen = range(plan.num_slices) if slice_indices is None else sorted(set(slice_indices))
    values, vectors, residuals, infos = _solve_slices(pencil, config, plan, chosen, progress)
    order = np.argsort(values, kind="stable")
    values, vectors, residuals = _merge_duplicates(
        values[order], vectors[:, order], residuals[order], pencil.mass
    )
    result = EigenResult(
        eigenvalues=values,
        eigenvectors=pencil.scaling[:, None] * vectors,
        residuals=residuals,
        counters=pencil.counters,
        slices=infos,
        lmin=pencil.lmin,
        lmax=pencil.lmax,
        mass_bounds=pencil.mass_bounds,
    )
    return finish_result(result, plan, config)


def estimate_dos(A: Operator, M: Operator | None, *, config: SolverConfig, degree: int = 100,
                 num_vectors: int = 30) -> DosEstimate:
    """KPM density of states of the pencil (A, M) after Jacobi scaling and mass setup."""
    pencil = scale_pencil(A, M, config)
    dos = kpm_dos(pencil, degree=degree, num_vectors=num_vectors, seed=config.seed)
    return DosEstimate(dos, pencil.counters)


def _read_matrix(path: str | os.PathLike[str], name: str) -> sp.csr_matrix:
    try:
        matrix = scipy.io.mmread(path)
    except OSError as exc:
        raise PencilError(name, f"cannot read {name} from {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # scipy's reader raises many kinds on a malformed file
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise PencilError(name, f"{path} is not a Matrix Market file ({text})") from None
    if np.ndim(matrix) != 2:
        raise PencilError(name, f"{path} holds a {np.ndim(matrix)}-D array, not a matrix")
    return sp.csr_matrix(matrix)


def load_pencil(a_path: str | os.PathLike[str],
                m_path: str | os.PathLike[str] | None = None) -> tuple[Any, Any | None]:
    """Read A (and M) from Matrix Market files as CSR matrices; M is None when not given.

    Raises:
        PencilError: a file that cannot be read as a Matrix Market matrix, a non-square A, or
            an M whose shape differs from A's.
    """
    A = _read_matrix(a_path, "A")
    M = None if m_path is None else _read_matrix(m_path, "M")
    if A.shape[0] != A.shape[1]:
        raise PencilError("A", f"A in {a_path} is not square: {A.shape[0]} x {A.shape[1]}")
    if M is not None and M.shape != A.shape:
        raise PencilError("M", f"M in {m_path} has shape {M.shape[0]} x {M.shape[1]}, A has "
                          f"{A.shape[0]} x {A.shape[1]}")
    return A, M
