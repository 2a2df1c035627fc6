"""Radial (1-D) elastic planet models for the normal-mode solvers.

Implements a piecewise-linear radial model rho(r), vp(r), vs(r) with first-order
discontinuities, readers for the files in ``shared/data/planet_models`` (Mineos-style
``.bm`` files, the PREM csv and the Weber et al. 2011 lunar table), the homogeneous ball
used as the CONST model by NormalModes (Shi et al., SC18), and the ``Mode`` record shared by
the Lamb and 1-D solvers.

Units follow NormalModes: radius in km, density in g/cm^3, speeds in km/s. Then
mu = rho vs^2 is in GPa and an eigenvalue of the elastic problem is omega^2 in s^-2, so
f[mHz] = 1e3 sqrt(omega^2) / (2 pi).

Transversely isotropic files (Love's A, C, F, L, N) are reduced to the Voigt-average
isotropic medium, kappa = (4A + C + 4F - 4N)/9 and mu = (A + C - 2F + 5N + 6L)/15.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "Mode",
    "RadialModel",
    "default_data_dir",
    "from_mhz",
    "homogeneous_ball",
    "load_planet",
    "read_bm",
    "read_moon_txt",
    "read_prem_csv",
    "to_mhz",
]


def to_mhz(eigenvalue):
    """Convert an eigenvalue omega^2 [s^-2] to a frequency in mHz."""
    ev = np.asarray(eigenvalue, dtype=float)
    if np.any(ev < 0):
        raise ValueError(f"eigenvalue omega^2 must be non-negative, got {eigenvalue!r}")
    out = 1e3 * np.sqrt(ev) / (2.0 * math.pi)
    return float(out) if out.ndim == 0 else out


def from_mhz(frequency_mhz):
    """Convert a frequency in mHz to the eigenvalue omega^2 [s^-2]."""
    f = np.asarray(frequency_mhz, dtype=float)
    if np.any(f < 0):
        raise ValueError(f"frequency must be non-negative, got {frequency_mhz!r}")
    out = (2.0 * math.pi * 1e-3 * f) ** 2
    return float(out) if out.ndim == 0 else out


@dataclass(frozen=True)
class Mode:
    """One multiplet nX_l: kind "T" (toroidal) or "S" (spheroidal), overtone n, degree l."""

    kind: str
    n: int
    l: int
    frequency_mhz: float
    multiplicity: int | None = None

    def __post_init__(self):
        if self.kind not in ("T", "S"):
            raise ValueError(f"Mode kind must be 'T' or 'S', got {self.kind!r}")
        if self.l < 0 or self.n < 0:
            raise ValueError(f"Mode needs n >= 0 and l >= 0, got n={self.n}, l={self.l}")
        if self.kind == "T" and self.l == 0:
            raise ValueError("toroidal modes need l >= 1 (l = 0 has no toroidal field)")
        if self.multiplicity is None:
            object.__setattr__(self, "multiplicity", 2 * self.l + 1)

    @property
    def name(self) -> str:
        return f"{self.n}{self.kind}{self.l}"

    @property
    def period_s(self) -> float:
        return 1e3 / self.frequency_mhz


@dataclass(frozen=True, eq=False)
class RadialModel:
    """Piecewise-linear radial model; a repeated radius marks a discontinuity.

    Arrays run from the centre (radius 0) to the surface. Between consecutive knots the
    properties are linear in r; at a repeated radius the first copy belongs to the layer
    below and the second to the layer above.
    """

    name: str
    radius_km: np.ndarray
    rho: np.ndarray
    vp: np.ndarray
    vs: np.ndarray
    _layer_bounds: tuple = field(init=False, repr=False)

    def __post_init__(self):
        arrays = {}
        for key in ("radius_km", "rho", "vp", "vs"):
            a = np.array(getattr(self, key), dtype=float).ravel()
            a.setflags(write=False)
            arrays[key] = a
            object.__setattr__(self, key, a)
        r = arrays["radius_km"]
        n = r.size
        if n < 2:
            raise ValueError(f"model {self.name!r} needs at least 2 knots, got {n}")
        for key, a in arrays.items():
            if a.size != n:
                raise ValueError(
                    f"model {self.name!r}: {key} has {a.size} values but radius_km has {n}"
                )
            if not np.all(np.isfinite(a)):
                raise ValueError(f"model {self.name!r}: {key} contains non-finite values")
        if abs(r[0]) > 1e-9:
            raise ValueError(f"model {self.name!r} must start at the centre, r[0] = {r[0]}")
        dr = np.diff(r)
        if np.any(dr < 0):
            raise ValueError(f"model {self.name!r}: radius_km must be non-decreasing")
        # three equal radii in a row would make a zero-thickness layer with no meaning
        if np.any((dr[:-1] == 0) & (dr[1:] == 0)):
            raise ValueError(f"model {self.name!r}: a radius is repeated more than twice")
        if dr[0] == 0 or dr[-1] == 0:
            raise ValueError(f"model {self.name!r}: discontinuity at the centre or surface")
        if np.any(arrays["rho"] <= 0):
            raise ValueError(f"model {self.name!r}: density must be positive")
        if np.any(arrays["vs"] < 0) or np.any(arrays["vp"] <= 0):
            raise ValueError(f"model {self.name!r}: need vp > 0 and vs >= 0")
        # kappa = rho (vp^2 - 4/3 vs^2) must stay positive for a stable medium
        if np.any(arrays["vp"] ** 2 <= 4.0 / 3.0 * arrays["vs"] ** 2):
            raise ValueError(f"model {self.name!r}: vp^2 <= 4/3 vs^2 (negative bulk modulus)")
        breaks = np.flatnonzero(dr == 0)
        starts = np.concatenate(([0], breaks + 1))
        stops = np.concatenate((breaks, [n - 1]))
        bounds = []
        for i0, i1 in zip(starts, stops):
            fluid = arrays["vs"][i0 : i1 + 1] == 0
            if fluid.any() and not fluid.all():
                raise ValueError(
                    f"model {self.name!r}: layer {r[i0]}-{r[i1]} km is partly fluid; "
                    "put a discontinuity (repeated radius) where vs becomes zero"
                )
            bounds.append((int(i0), int(i1), bool(fluid.all())))
        object.__setattr__(self, "_layer_bounds", tuple(bounds))

    # ------------------------------------------------------------------ geometry
    @property
    def surface_radius(self) -> float:
        return float(self.radius_km[-1])

    def layers(self) -> list[tuple[float, float, bool]]:
        """Layers between discontinuities as (r_bottom, r_top, is_fluid)."""
        r = self.radius_km
        return [(float(r[i0]), float(r[i1]), fl) for i0, i1, fl in self._layer_bounds]

    def solid_regions(self) -> list[tuple[float, float]]:
        """Maximal solid radial intervals (adjacent solid layers merged), bottom to top."""
        out: list[list[float]] = []
        prev_solid = False
        for rb, rt, fluid in self.layers():
            if fluid:
                prev_solid = False
                continue
            if prev_solid:
                out[-1][1] = rt
            else:
                out.append([rb, rt])
            prev_solid = True
        return [(a, b) for a, b in out]

    @property
    def fluid_core_radius(self) -> float:
        """Top of the fluid region under the outermost solid shell (0 if there is none).

        A fluid layer at the surface (PREM's ocean) is not a core, hence the restriction
        to fluid with solid above it.
        """
        solids = self.solid_regions()
        if not solids:
            return 0.0
        top_solid_bottom = solids[-1][0]
        fluid_tops = [rt for rb, rt, fl in self.layers() if fl and rt <= top_solid_bottom]
        return float(max(fluid_tops)) if fluid_tops else 0.0

    @property
    def knots(self) -> np.ndarray:
        """Distinct knot radii (discontinuities appear once)."""
        return np.unique(self.radius_km)

    # ------------------------------------------------------------------ evaluation
    def _interval(self, r: np.ndarray, side: str) -> np.ndarray:
        rad = self.radius_km
        if side == "above":
            idx = np.searchsorted(rad, r, side="right") - 1
        elif side == "below":
            idx = np.searchsorted(rad, r, side="left") - 1
        else:
            raise ValueError(f"side must be 'below' or 'above', got {side!r}")
        return np.clip(idx, 0, rad.size - 2)

    def at(self, r, side: str = "below"):
        """(rho, vp, vs) at radius r [km]; ``side`` picks the layer at a discontinuity.

        ``side="below"`` returns the values at the top of the lower layer, ``"above"`` those
        at the bottom of the upper layer. Away from discontinuities both agree.
        """
        rr = np.asarray(r, dtype=float)
        R = self.surface_radius
        if np.any(rr < -1e-9 * R) or np.any(rr > R * (1 + 1e-12)):
            raise ValueError(f"radius outside the model {self.name!r} range [0, {R}] km")
        rr = np.clip(rr, 0.0, R)
        i = self._interval(rr, side)
        r0 = self.radius_km[i]
        r1 = self.radius_km[i + 1]
        t = (rr - r0) / (r1 - r0)
        out = []
        for a in (self.rho, self.vp, self.vs):
            v = a[i] + t * (a[i + 1] - a[i])
            out.append(float(v) if v.ndim == 0 else v)
        return tuple(out)

    def lame(self, r, side: str = "below"):
        """(lambda, mu) at r in g/cm^3 (km/s)^2 = GPa, consistent with omega^2 in s^-2."""
        rho, vp, vs = self.at(r, side)
        mu = rho * vs**2
        lam = rho * vp**2 - 2.0 * mu
        return lam, mu


# ---------------------------------------------------------------------- builders
def homogeneous_ball(
    radius_km: float = 6371.0, vp: float = 10.0, vs: float = 5.7735, rho: float = 5.51
) -> RadialModel:
    """Homogeneous elastic ball; the defaults are NormalModes' CONST model."""
    if radius_km <= 0:
        raise ValueError(f"radius_km must be positive, got {radius_km}")
    return RadialModel(
        name="ball",
        radius_km=np.array([0.0, radius_km]),
        rho=np.full(2, rho),
        vp=np.full(2, vp),
        vs=np.full(2, vs),
    )


def _voigt_isotropic(rho, vpv, vph, vsv, vsh, eta):
    """Voigt-average isotropic (vp, vs) of a transversely isotropic medium."""
    A = rho * vph**2
    C = rho * vpv**2
    L = rho * vsv**2
    N = rho * vsh**2
    F = eta * (A - 2.0 * L)
    kappa = (4.0 * A + C + 4.0 * F - 4.0 * N) / 9.0
    mu = (A + C - 2.0 * F + 5.0 * N + 6.0 * L) / 15.0
    vs = np.sqrt(np.maximum(mu, 0.0) / rho)
    vp = np.sqrt((kappa + 4.0 * mu / 3.0) / rho)
    # exact zeros keep fluid layers recognisable after the round trip
    vs = np.where((vsv == 0) & (vsh == 0), 0.0, vs)
    return vp, vs


def _ascending(r, *cols):
    if r[0] > r[-1]:
        return (r[::-1],) + tuple(c[::-1] for c in cols)
    return (r,) + cols


def read_bm(path, name: str | None = None) -> RadialModel:
    """Read a Mineos-style ``.bm`` file (header keywords, then whitespace columns).

    Header keywords used: NAME, UNITS (m or km), ANISOTROPIC, COLUMNS. With UNITS m the
    density is in kg/m^3 and the speeds in m/s; they are converted to g/cm^3 and km/s.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    header: dict[str, str] = {}
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        tok = s.split()
        try:
            rows.append([float(t) for t in tok])
        except ValueError:
            if rows:
                raise ValueError(f"{path}:{lineno}: text line after data: {s!r}") from None
            header[tok[0].upper()] = " ".join(tok[1:])
    if "COLUMNS" not in header:
        raise ValueError(f"{path}: no COLUMNS header line")
    cols = header["COLUMNS"].lower().split()
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"{path}: data rows have differing numbers of columns")
    data = np.array(rows, dtype=float)
    if data.shape[1] < len(cols):
        raise ValueError(f"{path}: {data.shape[1]} data columns but COLUMNS names {len(cols)}")

    def col(*names):
        for nm in names:
            if nm in cols:
                return data[:, cols.index(nm)]
        raise ValueError(f"{path}: none of the columns {names} present in COLUMNS")

    units = header.get("UNITS", "m").strip().lower()
    if units not in ("m", "km"):
        raise ValueError(f"{path}: UNITS must be m or km, got {units!r}")
    # m, kg/m^3, m/s -> km, g/cm^3, km/s: all three are a factor 1000
    scale = 1e-3 if units == "m" else 1.0
    r = col("radius") * scale
    rho = col("rho", "density") * scale
    if "vpv" in cols:
        vpv, vph = col("vpv") * scale, col("vph", "vpv") * scale
        vsv, vsh = col("vsv") * scale, col("vsh", "vsv") * scale
        eta = col("eta") if "eta" in cols else np.ones_like(r)
        vp, vs = _voigt_isotropic(rho, vpv, vph, vsv, vsh, eta)
    else:
        vp, vs = col("vp") * scale, col("vs") * scale
    r, rho, vp, vs = _ascending(r, rho, vp, vs)
    return RadialModel(name or header.get("NAME", path.stem), r, rho, vp, vs)


def read_prem_csv(path, ocean: bool = True, name: str = "PREM") -> RadialModel:
    """Read ``PREM_1s.csv``: radius, depth [km], rho, vpv, vph, vsv, vsh, eta, Q_mu, Q_kappa.

    ``ocean=False`` drops the fluid surface layer; toroidal modes do not see it either way.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    data = np.loadtxt(path, delimiter=",", ndmin=2)
    if data.shape[1] < 8:
        raise ValueError(f"{path}: expected at least 8 columns, got {data.shape[1]}")
    r, rho, vpv, vph, vsv, vsh, eta = (data[:, i] for i in (0, 2, 3, 4, 5, 6, 7))
    vp, vs = _voigt_isotropic(rho, vpv, vph, vsv, vsh, eta)
    r, rho, vp, vs = _ascending(r, rho, vp, vs)
    model = RadialModel(name, r, rho, vp, vs)
    if not ocean:
        rb, _, fluid = model.layers()[-1]
        if fluid:
            keep = int(np.searchsorted(r, rb, side="left")) + 1
            model = RadialModel(name, r[:keep], rho[:keep], vp[:keep], vs[:keep])
    return model


def read_moon_txt(path, name: str = "moon_weber2011") -> RadialModel:
    """Read the Weber et al. (2011) table: radius [m], rho [kg/m^3], vp, vs [m/s], unused."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    data = np.loadtxt(path, ndmin=2)
    if data.shape[1] < 4:
        raise ValueError(f"{path}: expected at least 4 columns, got {data.shape[1]}")
    r, rho, vp, vs = (data[:, i] * 1e-3 for i in range(4))
    r, rho, vp, vs = _ascending(r, rho, vp, vs)
    return RadialModel(name, r, rho, vp, vs)


def default_data_dir() -> Path:
    """``<repo>/../shared/data/planet_models`` for a source checkout (src layout)."""
    return Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "planet_models"


# planet: (file name, reader of that file's format)
_FILES: dict[str, tuple[str, Callable[[Path], RadialModel]]] = {
    "mars": ("Mars_DWAK.bm", read_bm),
    "prem": ("PREM_1s.csv", read_prem_csv),
    "moon": ("moon_weber2011.txt", read_moon_txt),
}


def load_planet(name: str, data_dir=None) -> RadialModel:
    """Model by name: "ball" (CONST), "mars" (DWAK), "prem" or "moon" (Weber 2011)."""
    key = name.strip().lower()
    if key in ("ball", "const"):
        return homogeneous_ball()
    if key not in _FILES:
        raise ValueError(f"unknown planet {name!r}; choose from ball, mars, prem, moon")
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    fname, reader = _FILES[key]
    path = (base / fname).resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"planet model file for {name!r} not found at {path}; pass data_dir= to point "
            "at the directory holding the planet_models files"
        )
    return reader(path)
