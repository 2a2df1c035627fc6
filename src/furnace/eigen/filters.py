"""Chebyshev polynomial filters: a damped delta function at a balanced centre.

Implements pEVSL's `FindPol` (chebpol.c) as used by NormalModes (Shi, Li, Xi, Saad, de Hoop,
SC'18, section IV.A; Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 3.1):
the spectrum [lmin, lmax] is mapped to [-1, 1], the filter is the damped Chebyshev series of
delta(t - gamma) normalised to p(gamma) = 1, gamma = cos(theta_c) is balanced so that
p(a) = p(b), and the degree is the smallest (searched from 2 upward) with p(a) <= thresh_int.
Intervals touching an end of the spectrum centre the delta at that end instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from furnace.eigen.operators import Counters

# a matrix or an operator applied with `@` (a scipy sparse matrix, a dense array, a
# LinearOperator, `ScaledOperator`) or called; scipy ships no type information: Any
Operator: TypeAlias = Any

# a or b this close (in mapped units) to an end of [-1, 1] selects the end-interval filter
END_TOL = 1e-9


def damping_factors(degree: int, damping: str) -> np.ndarray:
    """Gibbs damping factors g_k, k = 0..degree (g_0 = 1)."""
    k = np.arange(degree + 1)
    if damping == "none":
        return np.ones(degree + 1)
    if damping == "sigma":
        # Lanczos sigma factors sin(x)/x with x = k pi / (m + 1)
        return np.sinc(k / (degree + 1))
    if damping == "jackson":
        step = np.pi / (degree + 1)
        return ((degree - k + 1) * np.cos(k * step) + np.sin(k * step) / np.tan(step)) / (
            degree + 1
        )
    raise ValueError(f"damping must be 'sigma', 'jackson' or 'none', got {damping!r}")


def chebyshev_series(coefficients: np.ndarray, t: npt.ArrayLike) -> np.ndarray:
    """sum_k c_k T_k(t) for any real t (three-term recurrence, valid outside [-1, 1] too)."""
    t = np.asarray(t, dtype=float)
    prev: np.ndarray = np.ones_like(t)
    total = coefficients[0] * prev
    if coefficients.size == 1:
        return total
    cur = t.copy()
    total = total + coefficients[1] * cur
    for c in coefficients[2:]:
        prev, cur = cur, 2.0 * t * cur - prev
        total = total + c * cur
    return total


def _delta_weights(degree: int, damping: str) -> np.ndarray:
    # the k = 0 term of the delta expansion carries half the weight of the others
    weights = damping_factors(degree, damping).copy()
    weights[0] *= 0.5
    return weights


def balance_theta(weights: np.ndarray, theta_a: float, theta_b: float) -> float:
    """theta_c in [theta_b, theta_a] with p(a) = p(b), by Newton safeguarded by bisection.

    f(theta) = sum_j w_j cos(j theta) [cos(j theta_b) - cos(j theta_a)] is the unnormalised
    p(b) - p(a); f > 0 means the peak leans to b, so theta_c moves towards theta_a.
    """
    j = np.arange(weights.size)
    diff = weights * (np.cos(j * theta_b) - np.cos(j * theta_a))

    def f(theta: float) -> float:
        return float(diff @ np.cos(j * theta))

    def df(theta: float) -> float:
        return float(-(diff * j) @ np.sin(j * theta))

    lo, hi = theta_b, theta_a
    f_lo, f_hi = f(lo), f(hi)
    if f_lo == 0.0:
        return lo
    if f_hi == 0.0:
        return hi
    if np.sign(f_lo) == np.sign(f_hi):
        # no sign change (only at very low degree): the midpoint is as good as any
        return 0.5 * (lo + hi)
    theta = 0.5 * (lo + hi)
    for _ in range(200):
        value = f(theta)
        if value == 0.0:
            return theta
        if np.sign(value) == np.sign(f_lo):
            lo, f_lo = theta, value
        else:
            hi = theta
        slope = df(theta)
        newton = theta - value / slope if slope != 0.0 else np.nan
        inside = np.isfinite(newton) and min(lo, hi) < newton < max(lo, hi)
        new_theta = newton if inside else 0.5 * (lo + hi)
        if abs(new_theta - theta) <= 1e-15 * max(1.0, abs(theta)):
            return new_theta
        theta = new_theta
    return theta


def _fresh(y: npt.ArrayLike, *others: np.ndarray) -> np.ndarray:
    """y as a float array we may overwrite: copied if it could alias an operand."""
    y = np.asarray(y, dtype=float)
    if not y.flags.writeable or any(np.may_share_memory(y, o) for o in others):
        return y.copy()
    return y


def _axpy(x: np.ndarray, y: np.ndarray, a: float) -> None:
    """y += a x in place.

    NumPy rather than BLAS daxpy on purpose: between two SpMVs OpenBLAS's threads have gone
    to sleep, and waking them costs ~150 us per call, far more than the update itself.
    """
    y += a * x


@dataclass
class ChebFilter:
    """p(lambda) = sum_k coefficients[k] T_k((lambda - center) / half_width).

    Attributes:
        coefficients: mu_k, normalised so that p(gamma) = 1 at the peak.
        degree: m.
        bar: filter value at the interval ends; Ritz values of p >= bar are wanted.
        center, half_width: c = (lmax + lmin) / 2, e = (lmax - lmin) / 2.
        gamma: peak position in mapped units, cos(theta_c).
        kind: "interior", "lower" (delta at lmin) or "upper" (delta at lmax).
    """

    coefficients: np.ndarray
    degree: int
    bar: float
    center: float
    half_width: float
    gamma: float
    a: float
    b: float
    kind: str

    @property
    def peak(self) -> float:
        """The peak position in lambda units."""
        return self.center + self.half_width * self.gamma

    def __call__(self, lam: npt.ArrayLike) -> np.ndarray:
        """Filter values at eigenvalue(s) lam."""
        return chebyshev_series(
            self.coefficients, (np.asarray(lam, dtype=float) - self.center) / self.half_width
        )

    def apply(self, op: Operator, v: np.ndarray, counters: Counters | None = None) -> np.ndarray:
        """p(op) v by the three-term recurrence on (op - c) / e: `degree` op applications.

        Args:
            op: callable x -> op(x), or an object with `@`; x may be (n,) or (n, k). An
                object with `chebyshev_step` (`ScaledOperator`) runs each step fused.
            v: the vector or block to filter.
            counters: optional `Counters`; filtered_matvecs grows by the number of columns.
        """
        apply_op = op if callable(op) else (lambda x: op @ x)
        fused = getattr(op, "supports_chebyshev_step", False)
        scale = 1.0 / self.half_width
        mu = self.coefficients
        out = mu[0] * v
        if self.degree >= 1:
            # T_1 = B v, T_{k+1} = 2 B T_k - T_{k-1} with B = (op - c) / e, updated in place:
            # the products are bandwidth-bound, and the textbook expression makes five
            # temporaries per step
            cur = _fresh(apply_op(v), v, out)
            _axpy(v, cur, -self.center)
            cur *= scale
            _axpy(cur, out, mu[1])
            prev = v
            for k in range(2, self.degree + 1):
                if fused:
                    nxt = op.chebyshev_step(cur, prev, out, self.center, 2.0 * scale, mu[k])
                else:
                    nxt = _fresh(apply_op(cur), cur, prev, out)
                    _axpy(cur, nxt, -self.center)
                    nxt *= 2.0 * scale
                    _axpy(prev, nxt, -1.0)
                    _axpy(nxt, out, mu[k])
                prev, cur = cur, nxt
        if counters is not None:
            counters.filtered_matvecs += 1 if v.ndim == 1 else v.shape[1]
            counters.filter_degree = max(counters.filter_degree, self.degree)
        return out


def find_polynomial(
    a: float,
    b: float,
    lmin: float,
    lmax: float,
    *,
    thresh_int: float = 0.8,
    thresh_ext: float = 0.7,
    damping: str = "sigma",
    max_degree: int = 10000,
) -> ChebFilter:
    """Smallest-degree damped delta filter for [a, b] inside the spectrum [lmin, lmax].

    The degree search starts at 2, as pEVSL effectively does: its `2 + (int) 0.5/(bb-aa)`
    casts only 0.5, and the serial-EVSL start 2 + 0.5/(bb-aa) overshoots into filters with a
    negative bar for narrow intervals at the bottom of a wide spectrum.

    Raises:
        ValueError: a >= b, lmin >= lmax, [a, b] misses [lmin, lmax] or covers all of it, or
            no degree up to max_degree reaches the threshold.
    """
    if not a < b:
        raise ValueError(f"need a < b, got a={a}, b={b}")
    if not lmin < lmax:
        raise ValueError(f"need lmin < lmax, got lmin={lmin}, lmax={lmax}")
    center, half_width = 0.5 * (lmax + lmin), 0.5 * (lmax - lmin)
    ta, tb = (a - center) / half_width, (b - center) / half_width
    if tb <= -1.0 or ta >= 1.0:
        raise ValueError(f"[a, b] = [{a}, {b}] lies outside the spectrum [{lmin}, {lmax}]")
    ta, tb = max(ta, -1.0), min(tb, 1.0)
    lower_end, upper_end = ta <= -1.0 + END_TOL, tb >= 1.0 - END_TOL
    if lower_end and upper_end:
        raise ValueError(
            f"[a, b] = [{a}, {b}] covers the whole spectrum [{lmin}, {lmax}]; no filter needed"
        )
    theta_a, theta_b = np.arccos(ta), np.arccos(tb)
    for degree in range(2, max_degree + 1):
        weights = _delta_weights(degree, damping)
        k = np.arange(degree + 1)
        if lower_end or upper_end:
            # delta at the spectrum end (theta_c = pi or 0), judged at the other end of [a, b]
            theta_c = np.pi if lower_end else 0.0
            thresh, theta_judge = thresh_ext, (theta_b if lower_end else theta_a)
        else:
            theta_c = balance_theta(weights, theta_a, theta_b)
            thresh, theta_judge = thresh_int, theta_a
        mu = weights * np.cos(k * theta_c)
        mu /= mu @ np.cos(k * theta_c)
        bar = float(mu @ np.cos(k * theta_judge))
        if bar <= thresh:
            kind = "lower" if lower_end else ("upper" if upper_end else "interior")
            return ChebFilter(
                coefficients=mu,
                degree=degree,
                bar=bar,
                center=center,
                half_width=half_width,
                gamma=float(np.cos(theta_c)),
                a=a,
                b=b,
                kind=kind,
            )
    raise ValueError(
        f"no filter of degree <= {max_degree} reaches the threshold for [{a}, {b}] in "
        f"[{lmin}, {lmax}]; raise max_degree or widen the interval"
    )
