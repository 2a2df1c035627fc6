"""`furnace reproduce eigen`: the filtered Lanczos solver against ARPACK and LOBPCG, and its
scaling on 1-2 ranks, on a pencil whose eigenvalues are known in closed form.

Follows design note ``eigensolver.md`` sections 5.3-5.5 (the comparisons Shi, Li, Xi, Saad
and de Hoop, SC'18 section V, and the SC19 teams make) with this package's own matrices:

- ``vs_arpack``: filtered Lanczos (lumped mass) against ARPACK shift-invert and LOBPCG on the
  same pencil at growing sizes, side by side in one run: time, process peak memory, matvecs,
  the crossover size, and the error against the closed form.
- ``scaling`` and ``sc18_model`` (`scaling_experiments.py`): strong and weak scaling on 1-2
  ranks with the SC19 "unified time", and the cost model (`costmodel.py`) fitted on those
  runs and projected to the SC'18 runs (`sc18.py`).

The pencil (`box_pencil`) is the Dirichlet Laplacian on the box [0, 1] x [0, 1.21] x [0, 1.46]
with trilinear (Q1) hexahedra on a uniform grid of c_x x c_y x c_z cells, and either the
consistent mass or the nodal-quadrature (lumped) mass h_x h_y h_z I. Both are Kronecker
products of the 1-D P1 matrices K1 = tridiag(-1, 2, -1) / h and M1 = tridiag(1, 4, 1) h / 6,

    K = K1_x (x) M1_y (x) M1_z + M1_x (x) K1_y (x) M1_z + M1_x (x) M1_y (x) K1_z,

and K1, M1 share the eigenvectors s_i(p) = sin(i p pi / c), i = 1 .. c - 1, with eigenvalues
kappa_i = 2 (1 - cos t_i) / h and mu_i = h (2 + cos t_i) / 3, t_i = i pi / c. So the
eigenvectors are s_i (x) s_j (x) s_k and (`box_eigenvalues`)

    lumped:      lambda_ijk = (kappa_i mu_j mu_k + mu_i kappa_j mu_k + mu_i mu_j kappa_k)
                              / (h_x h_y h_z),
    consistent:  lambda_ijk = kappa_i / mu_i + kappa_j / mu_j + kappa_k / mu_k.

Unequal side lengths keep the low eigenvalues apart (single-vector Lanczos needs no exact
repeats). The interval holds the 27 eigenvalues above the 6 lowest, with its ends at the
middles of the gaps (`box_interval`), so every size solves the same 27 modes, as the planet
experiments' interval sits above a ball's 6 rigid motions.

The planet experiments (Lamb, Mars) are in `furnace.normal_modes.experiments`, which also
runs the comparison of this module (`compare_solvers`) on the elastic ball.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from furnace.runtime.reproduce import Experiment, Result, RunContext

from .comparison import ComparisonPencil, compare_solvers
from .scaling_experiments import sc18_model, strong_weak

BOX_LENGTHS = (1.0, 1.21, 1.46)
# the interval: the 27 eigenvalues above the 6 lowest
BOX_BELOW, BOX_COUNT = 6, 27


def box_cells(cells_per_unit: int) -> tuple[int, ...]:
    """Cells along each edge of the box for a grid spacing of about 1 / cells_per_unit."""
    if cells_per_unit < 2:
        raise ValueError(f"need at least 2 cells per unit length, got {cells_per_unit}")
    return tuple(max(2, round(length * cells_per_unit)) for length in BOX_LENGTHS)


def _one_d(cells: int, length: float):
    import scipy.sparse as sp

    h = length / cells
    m = cells - 1
    stiffness = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(m, m)) / h
    mass = sp.diags([1.0, 4.0, 1.0], [-1, 0, 1], shape=(m, m)) * (h / 6.0)
    return stiffness.tocsr(), mass.tocsr(), h


def box_pencil(cells: Sequence[int], mass: str = "lumped"):
    """(K, M) of the Q1 Dirichlet Laplacian on the box (module docstring), sparse CSR.

    cells: cells along x, y, z (>= 2 each). Unknowns are the interior nodes, x slowest.
    mass: "lumped" (h_x h_y h_z I) or "consistent" (M1_x (x) M1_y (x) M1_z).
    """
    import scipy.sparse as sp

    if len(cells) != 3 or min(cells) < 2:
        raise ValueError(f"need three cell counts >= 2, got {tuple(cells)}")
    if mass not in ("lumped", "consistent"):
        raise ValueError(f"mass must be 'lumped' or 'consistent', got {mass!r}")
    (kx, mx, hx), (ky, my, hy), (kz, mz, hz) = (_one_d(c, length)
                                                for c, length in zip(cells, BOX_LENGTHS))
    K = (sp.kron(sp.kron(kx, my), mz) + sp.kron(sp.kron(mx, ky), mz)
         + sp.kron(sp.kron(mx, my), kz)).tocsr()
    if mass == "lumped":
        M = sp.diags(np.full(K.shape[0], hx * hy * hz)).tocsr()
    else:
        M = sp.kron(sp.kron(mx, my), mz).tocsr()
    return K, M


def _one_d_spectrum(cells: int, length: float):
    h = length / cells
    t = np.arange(1, cells) * np.pi / cells
    return 2.0 * (1.0 - np.cos(t)) / h, h * (2.0 + np.cos(t)) / 3.0, h


def _box_spectrum_grid(cells: Sequence[int], mass: str) -> np.ndarray:
    (k0, m0, h0), (k1, m1, h1), (k2, m2, h2) = (_one_d_spectrum(c, length)
                                                for c, length in zip(cells, BOX_LENGTHS))
    x, y, z = (slice(None), None, None), (None, slice(None), None), (None, None, slice(None))
    if mass == "lumped":
        return (k0[x] * m1[y] * m2[z] + m0[x] * k1[y] * m2[z]
                + m0[x] * m1[y] * k2[z]) / (h0 * h1 * h2)
    return (k0 / m0)[x] + (k1 / m1)[y] + (k2 / m2)[z]


def box_eigenvalues(cells: Sequence[int], mass: str = "lumped") -> np.ndarray:
    """All eigenvalues of `box_pencil(cells, mass)`, ascending, in closed form."""
    return np.sort(_box_spectrum_grid(cells, mass).ravel())


def box_eigenvectors(cells: Sequence[int], count: int, mass: str = "lumped") -> np.ndarray:
    """The eigenvectors of the ``count`` lowest eigenvalues, M-orthonormal, [n, count]."""
    grid = _box_spectrum_grid(cells, mass)
    order = np.argsort(grid.ravel(), kind="stable")[:count]
    _, M = box_pencil(cells, mass)
    out = np.empty((grid.size, count))
    for col, flat in enumerate(order):
        i, j, k = np.unravel_index(flat, grid.shape)
        parts = [np.sin((index + 1) * np.arange(1, c) * np.pi / c)
                 for index, c in zip((i, j, k), cells)]
        v = np.kron(np.kron(parts[0], parts[1]), parts[2])
        out[:, col] = v / np.sqrt(v @ (M @ v))
    return out


def box_interval(cells: Sequence[int], below: int = BOX_BELOW, count: int = BOX_COUNT,
                 mass: str = "lumped") -> tuple[float, float]:
    """[a, b] holding eigenvalues below .. below + count - 1 (0-based), ends mid-gap."""
    values = box_eigenvalues(cells, mass)
    if below < 1 or below + count >= values.size:
        raise ValueError(f"the grid {tuple(cells)} has {values.size} eigenvalues; cannot "
                         f"skip {below} and take {count}")
    a = 0.5 * (values[below - 1] + values[below])
    b = 0.5 * (values[below + count - 1] + values[below + count])
    return float(a), float(b)


def box_comparison_pencil(cells_per_unit: int) -> ComparisonPencil:
    """The lumped box pencil at about 1 / cells_per_unit spacing, for `compare_solvers`."""
    cells = box_cells(cells_per_unit)
    K, M = box_pencil(cells)
    a, b = box_interval(cells)
    values = box_eigenvalues(cells)
    return ComparisonPencil(label=f"N={cells_per_unit}", size=cells_per_unit, K=K, M=M, a=a,
                            b=b, constraints=box_eigenvectors(cells, BOX_BELOW),
                            exact=values[BOX_BELOW:BOX_BELOW + BOX_COUNT])


# cells per unit length: 1,386 / 3,952 / 12,236 / 31,616 / 83,952 unknowns
VS_ARPACK_QUICK = (10, 14)
VS_ARPACK_FULL = (10, 14, 20, 27, 37)


def vs_arpack(ctx: RunContext) -> Result:
    sizes = VS_ARPACK_QUICK if ctx.quick else VS_ARPACK_FULL
    cells = [box_cells(s) for s in sizes]
    note = ("Q1 Dirichlet Laplacian on the box [0, 1] x [0, 1.21] x [0, 1.46] with lumped "
            "mass; N = cells per unit length (grids " + ", ".join(
                "x".join(map(str, c)) for c in cells) + "); [a, b] holds the 27 eigenvalues "
            "above the 6 lowest, whose eigenvectors are LOBPCG's constraints.")
    return compare_solvers(ctx, [functools.partial(box_comparison_pencil, s) for s in sizes],
                           size_column="N", pencil_note=note,
                           lobpcg_iterations=100 if ctx.quick else 300)


EXPERIMENTS = [
    Experiment("eigen", "vs_arpack", "Filtered Lanczos vs ARPACK shift-invert and LOBPCG",
               vs_arpack),
    Experiment("eigen", "scaling", "Strong and weak scaling on 1-2 ranks, unified time",
               strong_weak),
    Experiment("eigen", "sc18_model", "Fitted scaling model projected to the SC'18 runs",
               sc18_model),
]
