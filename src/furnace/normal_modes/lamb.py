"""Free oscillations of a homogeneous, non-gravitating elastic sphere (Lamb 1882).

Implements the traction-free characteristic equations for toroidal (nT_l), radial (nS_0)
and spheroidal (nS_l) modes in terms of spherical Bessel functions, following Lamb (1882),
"On the vibrations of an elastic sphere", Proc. London Math. Soc. 13, and Dahlen & Tromp
(1998), Theoretical Global Seismology, ch. 8. Roots are returned as the dimensionless
y = omega a / beta; ``lamb_modes`` turns them into multiplets in mHz.

With x = omega a / alpha, L = l(l+1) and mu = 1 (so lambda + 2 mu = (alpha/beta)^2):

* toroidal:    (l - 1) j_l(y) - y j_{l+1}(y) = 0
* radial:      -(lambda + 2 mu) x^2 j_0(x) + 4 mu x j_1(x) = 0
* spheroidal:  det [[a11, a12], [a21, a22]] = 0 with
  a11 = -(lambda + 2 mu) x^2 j_l(x) - 4 mu x j_l'(x) + 2 mu L j_l(x),
  a12 = 2 mu L (y j_l'(y) - j_l(y)),
  a21 = 2 mu (x j_l'(x) - j_l(x)),
  a22 = mu (-2 y j_l'(y) + (2L - 2 - y^2) j_l(y)).

Overtone numbers count the non-zero roots from 0, except for l = 1 where the rigid
rotation (T) and translation (S) take the place of n = 0, so 1T1 and 1S1 are the lowest.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import spherical_jn

from furnace.normal_modes.models import Mode

__all__ = [
    "Mode",
    "lamb_modes",
    "radial_det",
    "radial_roots",
    "spheroidal_det",
    "spheroidal_roots",
    "toroidal_det",
    "toroidal_roots",
]

POISSON_VP_VS = math.sqrt(3.0)

# scan step in y; the characteristic functions oscillate with period ~pi in y (and
# pi * alpha / beta in y for the P terms), so 200 samples per period leave no pair of
# roots inside one step for the ratios vp/vs that occur in planets
_DY = 0.015


def _check_l(l: int, lmin: int) -> int:
    if int(l) != l or l < lmin:
        raise ValueError(f"degree l must be an integer >= {lmin}, got {l!r}")
    return int(l)


def _check_ratio(vp_vs: float) -> float:
    if not vp_vs**2 > 4.0 / 3.0:
        raise ValueError(
            f"vp/vs must exceed sqrt(4/3) = 1.1547 (positive bulk modulus), got {vp_vs!r}"
        )
    return float(vp_vs)


def toroidal_det(l: int, y):
    """Toroidal characteristic function (l - 1) j_l(y) - y j_{l+1}(y)."""
    y = np.asarray(y, dtype=float)
    return (l - 1) * spherical_jn(l, y) - y * spherical_jn(l + 1, y)


def radial_det(y, vp_vs: float = POISSON_VP_VS):
    """Radial (l = 0) characteristic function with mu = 1, as a function of y."""
    y = np.asarray(y, dtype=float)
    x = y / vp_vs
    return -(vp_vs**2) * x**2 * spherical_jn(0, x) + 4.0 * x * spherical_jn(1, x)


def spheroidal_det(l: int, y, vp_vs: float = POISSON_VP_VS):
    """Spheroidal 2x2 traction determinant (mu = 1) as a function of y = omega a / beta."""
    y = np.asarray(y, dtype=float)
    x = y / vp_vs
    L = l * (l + 1.0)
    jx = spherical_jn(l, x)
    djx = spherical_jn(l, x, derivative=True)
    jy = spherical_jn(l, y)
    djy = spherical_jn(l, y, derivative=True)
    a11 = -(vp_vs**2) * x**2 * jx - 4.0 * x * djx + 2.0 * L * jx
    a12 = 2.0 * L * (y * djy - jy)
    a21 = 2.0 * (x * djx - jx)
    a22 = -2.0 * y * djy + (2.0 * L - 2.0 - y**2) * jy
    return a11 * a22 - a12 * a21


def _y_start(l: int) -> float:
    """Lower end of the scan in y.

    Near y = 0 the functions behave like y^(2l) and, for large l, change sign from
    round-off and underflow, which would give false roots. For l >= 2 no non-zero mode of
    a homogeneous sphere lies below about 0.55 (l + 1/2) even as the bulk modulus goes to
    zero (the Rayleigh-wave limit), so 0.25 (l + 1/2) is safe. For l <= 1 the functions are
    clean power laws (~y^2, y^3) down to 1e-4, while a nearly zero bulk modulus pulls 0S0
    and 1S1 down towards 0.1, so the scan starts at 0.01. A fixed fraction of the scanned
    range, as sometimes advised, would skip the low roots once the range is large.
    """
    return 0.01 if l <= 1 else 0.25 * (l + 0.5)


def _scan_roots(func: Callable[[np.ndarray], np.ndarray], y_lo: float, y_max: float) -> list[float]:
    if y_max <= y_lo:
        return []
    num = int(math.ceil((y_max - y_lo) / _DY)) + 1
    grid = np.linspace(y_lo, y_max, num)
    vals = func(grid)
    if not np.all(np.isfinite(vals)):
        raise ValueError("characteristic function is not finite on the scan grid")
    if np.any(vals == 0.0) and np.all(vals[: max(1, num // 20)] == 0.0):
        raise ValueError("characteristic function underflows at the scan start; l too large")
    roots = []
    for i in range(num - 1):
        f0, f1 = vals[i], vals[i + 1]
        if f0 == 0.0:
            # an exact zero on a grid point is a root; brackets then skip it
            roots.append(float(grid[i]))
            continue
        if f0 * f1 < 0.0:
            roots.append(
                brentq(lambda t: float(func(np.array(t))), grid[i], grid[i + 1], xtol=1e-14)
            )
    if vals[-1] == 0.0:
        roots.append(float(grid[-1]))
    return roots


def _roots(func, l: int, n_max: int | None, y_max: float | None) -> np.ndarray:
    if n_max is None and y_max is None:
        raise ValueError("give n_max (number of roots) or y_max (upper bound of omega a/beta)")
    if n_max is not None and (int(n_max) != n_max or n_max < 0):
        raise ValueError(f"n_max must be a non-negative integer, got {n_max!r}")
    if y_max is not None and not y_max > 0:
        raise ValueError(f"y_max must be positive, got {y_max!r}")
    lo = _y_start(l)
    if y_max is not None:
        roots = _scan_roots(func, lo, float(y_max))
    else:
        assert n_max is not None  # checked above: one of n_max and y_max is given
        # root spacing is about pi, so this bound usually holds n_max roots at once
        hi = lo + 4.0 * (n_max + 2)
        roots = _scan_roots(func, lo, hi)
        while len(roots) < n_max:
            roots += _scan_roots(func, hi, 2.0 * hi)[1 if roots and roots[-1] == hi else 0 :]
            hi *= 2.0
    if n_max is not None:
        roots = roots[:n_max]
    return np.asarray(roots, dtype=float)


def toroidal_roots(l: int, n_max: int | None = None, *, y_max: float | None = None):
    """Roots y = omega a / beta of the toroidal equation for degree l >= 1, ascending.

    Returns the first ``n_max`` roots, or all roots up to ``y_max`` (both: the tighter).
    The rigid rotation y = 0 of l = 1 is excluded.
    """
    l = _check_l(l, 1)
    return _roots(lambda y: toroidal_det(l, y), l, n_max, y_max)


def radial_roots(
    n_max: int | None = None, *, vp_vs: float = POISSON_VP_VS, y_max: float | None = None
):
    """Roots y = omega a / beta of the radial (nS_0) equation, ascending."""
    r = _check_ratio(vp_vs)
    return _roots(lambda y: radial_det(y, r), 0, n_max, y_max)


def spheroidal_roots(
    l: int,
    n_max: int | None = None,
    *,
    vp_vs: float = POISSON_VP_VS,
    y_max: float | None = None,
):
    """Roots y = omega a / beta of the spheroidal equation for degree l, ascending.

    l = 0 is the radial equation; for l = 1 the translation y = 0 is excluded.
    """
    l = _check_l(l, 0)
    if l == 0:
        return radial_roots(n_max, vp_vs=vp_vs, y_max=y_max)
    r = _check_ratio(vp_vs)
    return _roots(lambda y: spheroidal_det(l, y, r), l, n_max, y_max)


def lamb_modes(radius_km: float, vp: float, vs: float, rho: float, fmax_mhz: float) -> list[Mode]:
    """All multiplets of a homogeneous sphere with frequency <= fmax_mhz, sorted by frequency.

    Units as in ``models``: km, km/s, g/cm^3. The density does not enter the frequencies of
    a non-gravitating homogeneous sphere; it is checked only for consistency.
    """
    if not radius_km > 0:
        raise ValueError(f"radius_km must be positive, got {radius_km!r}")
    if not vs > 0:
        raise ValueError(f"vs must be positive (a fluid sphere has no Lamb modes), got {vs!r}")
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho!r}")
    if not fmax_mhz > 0:
        raise ValueError(f"fmax_mhz must be positive, got {fmax_mhz!r}")
    ratio = _check_ratio(vp / vs)
    # omega = y beta / a, f[mHz] = 1e3 omega / (2 pi)
    to_f = 1e3 * vs / (2.0 * math.pi * radius_km)
    y_max = fmax_mhz / to_f
    modes = [
        Mode("S", n, 0, y * to_f) for n, y in enumerate(radial_roots(vp_vs=ratio, y_max=y_max))
    ]
    l = 1
    while True:
        first = 1 if l == 1 else 0
        t = toroidal_roots(l, y_max=y_max)
        s = spheroidal_roots(l, vp_vs=ratio, y_max=y_max)
        modes += [Mode("T", first + k, l, y * to_f) for k, y in enumerate(t)]
        modes += [Mode("S", first + k, l, y * to_f) for k, y in enumerate(s)]
        # the fundamentals rise with l from l = 2 on, so the first empty degree ends it
        if l >= 2 and t.size == 0 and s.size == 0:
            break
        l += 1
    modes.sort(key=lambda m: (m.frequency_mhz, m.kind, m.l, m.n))
    return modes
