"""Kernel polynomial (KPM) density of states of a pencil and equal-count spectrum slicing.

Implements EVSL's `kpmdos` and `spslicer` (Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput.
2019, section 2; Lin, Saad, Yang, "Approximating spectral densities of large matrices", SIAM
Review 2016, section 3.1), used by pEVSL to give each slice of [a, b] the same share of
eigenvalues (Shi, Li, Xi, Saad, de Hoop, SC'18, section IV.C). With rows split over ranks the
probe traces are summed locally and reduced once, through `pencil.space`.

The estimate is approximate, and `DensityOfStates.count_tolerance` states by how much: the
Hutchinson estimator's standard error, measured from the spread of the per-probe counts
(Lin, Saad, Yang 2016, section 2.2), plus the count the Jackson kernel smears across each end
of the interval (the estimated count within half a kernel width, pi / (2 (degree + 1)) in
theta, of the end; Weisse, Wellein, Alvermann, Fehske, "The kernel polynomial method", Rev.
Mod. Phys. 78, 2006, section II.C), plus a relative and an absolute slack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from furnace.eigen.filters import damping_factors
from furnace.eigen.operators import ScaledPencil

# count_tolerance = DOS_SIGMAS * standard error + boundary blur + DOS_RELATIVE * |count|
# + DOS_ABSOLUTE: wide enough to cover the true count of every random interval that
# tests/eigen/test_dos.py draws on spectra with and without repeated eigenvalues, tight enough
# to catch a solve that found 611 of 989 (the same test)
DOS_SIGMAS = 4.0
DOS_RELATIVE = 0.05
DOS_ABSOLUTE = 2.0


@dataclass
class DensityOfStates:
    """phi(t) = 1 / (pi sqrt(1 - t^2)) sum_k (2 - delta_k0) g_k mu_k T_k(t) in mapped t.

    Attributes:
        moments: mu_k ~ trace(T_k(B)), k = 0..degree, B the mapped operator (mu_0 ~ n).
        damping: g_k (Jackson by default).
        lmin, lmax: the spectrum bounds the map t = (lambda - c) / e uses.
        probe_moments: (degree + 1, num_vectors) v^T T_k(B) v for each probe v (their mean
            is `moments`); None when not kept, and then no error estimate is available.
    """

    moments: np.ndarray
    damping: np.ndarray
    lmin: float
    lmax: float
    probe_moments: np.ndarray | None = None

    @property
    def size(self) -> float:
        """Estimated number of eigenvalues, mu_0."""
        return float(self.moments[0])

    @property
    def degree(self) -> int:
        return int(self.moments.size - 1)

    def _theta(self, lam: npt.ArrayLike) -> np.ndarray:
        center, half_width = 0.5 * (self.lmax + self.lmin), 0.5 * (self.lmax - self.lmin)
        t = np.clip((np.asarray(lam, dtype=float) - center) / half_width, -1.0, 1.0)
        return np.arccos(t)

    def _count_below(self, lam: npt.ArrayLike, moments: np.ndarray) -> np.ndarray:
        theta = self._theta(lam)
        # with t = cos(theta), int T_k(t) / sqrt(1 - t^2) dt = -sin(k theta) / k
        k = np.arange(1, moments.shape[0])
        weighted = (self.damping[1:] / k).reshape((-1,) + (1,) * (moments.ndim - 1)) * moments[1:]
        series = np.sin(np.multiply.outer(theta, k)) @ weighted
        return (np.multiply.outer(np.pi - theta, moments[0]) - 2.0 * series) / np.pi

    def count_below(self, lam: npt.ArrayLike) -> np.ndarray:
        """Estimated number of eigenvalues <= lam (integral of phi from lmin)."""
        return self._count_below(lam, self.moments)

    def count(self, lo: float, hi: float) -> float:
        """Estimated number of eigenvalues in [lo, hi]."""
        return float(self.count_below(hi) - self.count_below(lo))

    def count_error(self, lo: float, hi: float) -> float:
        """Standard error of `count(lo, hi)`: the spread of the per-probe counts / sqrt(n_v)."""
        if self.probe_moments is None or self.probe_moments.shape[1] < 2:
            return float("inf")
        per_probe = self._count_below(np.array([lo, hi]), self.probe_moments)
        counts = per_probe[1] - per_probe[0]
        return float(np.std(counts, ddof=1) / np.sqrt(counts.size))

    def boundary_blur(self, lam: float) -> float:
        """The estimated count within half a kernel width (pi / (2 (degree + 1)) in theta) of
        lam on either side: how many eigenvalues the Jackson kernel smears across a cut at
        lam. It bounds the smoothing error of a count cut there, jumps of a degenerate
        spectrum included (measured in tests/eigen/test_dos.py)."""
        theta = float(self._theta(lam))
        width = 0.5 * np.pi / (self.degree + 1)
        center, half_width = 0.5 * (self.lmax + self.lmin), 0.5 * (self.lmax - self.lmin)
        around = center + half_width * np.cos(np.clip([theta - width, theta + width], 0.0,
                                                      np.pi))
        below = self.count_below(around)
        return float(abs(below[0] - below[1]))

    def count_tolerance(self, lo: float, hi: float) -> float:
        """How far the true count in [lo, hi] may be from `count(lo, hi)`:
        DOS_SIGMAS standard errors + the boundary blur at lo and at hi
        + DOS_RELATIVE * |count| + DOS_ABSOLUTE."""
        return float(DOS_SIGMAS * self.count_error(lo, hi) + self.boundary_blur(lo)
                     + self.boundary_blur(hi) + DOS_RELATIVE * abs(self.count(lo, hi))
                     + DOS_ABSOLUTE)

    def __call__(self, lam: npt.ArrayLike) -> np.ndarray:
        """Density per unit lambda."""
        theta = self._theta(lam)
        k = np.arange(self.moments.size)
        coeffs = self.damping * self.moments * np.where(k == 0, 1.0, 2.0)
        t_sum = np.cos(np.multiply.outer(theta, k)) @ coeffs
        half_width = 0.5 * (self.lmax - self.lmin)
        sin_theta = np.maximum(np.sin(theta), 1e-12)
        return t_sum / (np.pi * sin_theta * half_width)


def kpm_dos(
    pencil: ScaledPencil,
    *,
    degree: int = 100,
    num_vectors: int = 30,
    damping: str = "jackson",
    seed: int = 0,
) -> DensityOfStates:
    """KPM estimate of the spectral density of M~^-1 A~ (Hutchinson trace of T_k).

    trace(T_k(M^-1 A)) is similarity-invariant, so plain Rademacher vectors v with
    E[v v^T] = I estimate it without the M-inner product. All vectors advance as one block.
    The probes are drawn for all n rows on every rank and restricted to the local ones, so a
    row partition sees the serial probes; the moments are sums over rows, so the per-rank
    partial moments need a single reduction at the end.
    """
    if degree < 1 or num_vectors < 1:
        raise ValueError(f"degree and num_vectors must be >= 1, got {degree}, {num_vectors}")
    center = 0.5 * (pencil.lmax + pencil.lmin)
    half_width = 0.5 * (pencil.lmax - pencil.lmin)
    rng = np.random.default_rng(seed)
    space = pencil.space
    probes = space.restrict(rng.choice([-1.0, 1.0], size=(space.size, num_vectors)))

    def mapped(x: np.ndarray) -> np.ndarray:
        return (pencil.apply_minv_a(x) - center * x) / half_width

    # per-probe traces v^T T_k(B) v: their mean is the moment, their spread its error
    per_probe = np.empty((degree + 1, num_vectors))
    prev = probes
    per_probe[0] = np.einsum("ij,ij->j", probes, prev)
    cur = mapped(probes)
    per_probe[1] = np.einsum("ij,ij->j", probes, cur)
    for k in range(2, degree + 1):
        prev, cur = cur, 2.0 * mapped(cur) - prev
        per_probe[k] = np.einsum("ij,ij->j", probes, cur)
    per_probe = space.reduce(per_probe)
    moments = per_probe.mean(axis=1)
    return DensityOfStates(moments, damping_factors(degree, damping), pencil.lmin, pencil.lmax,
                           probe_moments=per_probe)


def slice_spectrum(
    dos: DensityOfStates, a: float, b: float, num_slices: int, *, num_points: int = 2001
) -> np.ndarray:
    """Boundaries a = s_0 < s_1 < ... < s_num_slices = b with equal estimated counts.

    The cumulative count on a fine grid of [a, b] is made monotone (KPM ripples can make it
    dip) and inverted by linear interpolation.
    """
    if not a < b:
        raise ValueError(f"need a < b, got a={a}, b={b}")
    if num_slices < 1:
        raise ValueError(f"num_slices must be >= 1, got {num_slices}")
    grid = np.linspace(a, b, num_points)
    cumulative = np.maximum.accumulate(dos.count_below(grid) - dos.count_below(a))
    total = cumulative[-1]
    bounds = np.empty(num_slices + 1)
    bounds[0], bounds[-1] = a, b
    if total <= 0:
        # no eigenvalues expected: fall back to equal widths
        bounds[1:-1] = np.linspace(a, b, num_slices + 1)[1:-1]
        return bounds
    # strictly increasing x for interp: break flat stretches by a tiny ramp
    cumulative = cumulative + np.linspace(0.0, 1e-9 * total, num_points)
    targets = total * np.arange(1, num_slices) / num_slices
    bounds[1:-1] = np.interp(targets, cumulative, grid)
    return bounds
