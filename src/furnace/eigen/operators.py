"""Operators of the pencil A x = lambda M x: Jacobi scaling, mass solves, spectral bounds.

Implements the operator layer of pEVSL's ChebLanNr as used by NormalModes (Shi, Li, Xi, Saad,
de Hoop, SC'18, section IV.B): the Jacobi scaling D = diag(M)^-1/2, the fixed-degree Chebyshev
iteration for the scaled mass matrix (Saad, Iterative Methods for Sparse Linear Systems, 2nd
ed., p. 399, Algorithm 12.1), the lumped (diagonal) alternative, and Lanczos estimates of
spectral bounds (Li, Xi, Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 3).

A and M may be scipy sparse matrices, dense arrays or `scipy.sparse.linalg.LinearOperator`;
every operator here accepts vectors (n,) and blocks (n, k). Every inner product goes through a
"space" (`SerialSpace` here, `furnace.eigen.distributed.DistributedSpace` for rows split over
MPI ranks, as pEVSL's ParCSR vectors are), so the same code runs on one rank or on a row
partition.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from furnace.eigen.checks import PencilError


@dataclass
class Counters:
    """Work done by every stage, counted per vector (a block of k columns counts k).

    With rows split over ranks every count is one rank's own: halo_bytes and halo_messages
    are what it sent in the ghost exchanges of its matvecs, allreduces its global reductions
    (all three stay 0 on one rank).
    """

    a_matvecs: int = 0
    m_matvecs: int = 0
    filtered_matvecs: int = 0
    filter_degree: int = 0
    lanczos_steps: int = 0
    reorth_flops: int = 0
    peak_basis_bytes: int = 0
    halo_bytes: int = 0
    halo_messages: int = 0
    allreduces: int = 0

    def merge(self, other: Counters) -> None:
        self.a_matvecs += other.a_matvecs
        self.m_matvecs += other.m_matvecs
        self.filtered_matvecs += other.filtered_matvecs
        self.filter_degree = max(self.filter_degree, other.filter_degree)
        self.lanczos_steps += other.lanczos_steps
        self.reorth_flops += other.reorth_flops
        self.peak_basis_bytes = max(self.peak_basis_bytes, other.peak_basis_bytes)
        self.halo_bytes += other.halo_bytes
        self.halo_messages += other.halo_messages
        self.allreduces += other.allreduces


def _num_columns(x: np.ndarray) -> int:
    return 1 if x.ndim == 1 else x.shape[1]


def check_square(op, name: str) -> int:
    """Return n for a square (n, n) operator, else raise ValueError."""
    shape = getattr(op, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D matrix or LinearOperator, got {type(op).__name__}")
    if shape[0] != shape[1]:
        raise ValueError(f"{name} must be square, got shape {shape}")
    return int(shape[0])


def operator_diagonal(op) -> np.ndarray:
    """Diagonal of a matrix, or of a LinearOperator by probing with unit-vector blocks."""
    if sp.issparse(op):
        return np.asarray(op.diagonal(), dtype=float)
    if isinstance(op, np.ndarray):
        return np.diag(op).astype(float)
    n = check_square(op, "operator")
    diag = np.empty(n)
    block = 256
    for start in range(0, n, block):
        stop = min(n, start + block)
        probe = np.zeros((n, stop - start))
        probe[np.arange(start, stop), np.arange(stop - start)] = 1.0
        diag[start:stop] = (op @ probe)[np.arange(start, stop), np.arange(stop - start)]
    return diag


def row_sums(op) -> np.ndarray:
    """Row sums M 1, the lumped mass diagonal."""
    if sp.issparse(op):
        return np.asarray(op.sum(axis=1)).ravel().astype(float)
    n = check_square(op, "M")
    return np.asarray(op @ np.ones(n), dtype=float).ravel()


def is_diagonal(op) -> bool:
    if sp.issparse(op):
        coo = op.tocoo()
        return bool(np.all((coo.row == coo.col) | (coo.data == 0)))
    if isinstance(op, np.ndarray):
        return bool(np.count_nonzero(op - np.diag(np.diag(op))) == 0)
    return False


# below this many nonzeros a thread hand-off costs more than the SpMV it would split
THREADED_SPMV_MIN_NNZ = 250_000


class ScaledOperator:
    """D X D for the Jacobi scaling D = diag(d); counts matvecs into a Counters field.

    A sparse X is scaled once into a CSR matrix. With threads > 1 its rows are cut into that
    many blocks of equal nonzeros, multiplied concurrently (SciPy's CSR kernels release the
    GIL) into disjoint slices of the output: the shared-memory analogue of pEVSL's OpenMP
    SpMV, worth having because the solver is SpMV-bound. Matrices with fewer than
    thread_min_nnz nonzeros stay single-threaded.
    """

    def __init__(self, op, d: np.ndarray, counters: Counters, field_name: str,
                 threads: int = 1, thread_min_nnz: int | None = None):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.shape = (d.size, d.size)
        self.counters = counters
        self.field_name = field_name
        self._blocks, self._pool = None, None
        if sp.issparse(op):
            scaling = sp.diags(d)
            self._scaled = (scaling @ sp.csr_matrix(op) @ scaling).tocsr()
            self._op, self._d = None, None
            if thread_min_nnz is None:
                thread_min_nnz = THREADED_SPMV_MIN_NNZ
            if threads > 1 and self._scaled.nnz >= thread_min_nnz:
                from concurrent.futures import ThreadPoolExecutor

                indptr = self._scaled.indptr
                cuts = np.searchsorted(indptr, np.linspace(0, indptr[-1], threads + 1))
                cuts[0], cuts[-1] = 0, d.size
                self._blocks = [(int(lo), int(hi), self._scaled[lo:hi])
                                for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]
                # the calling thread takes the first block itself: one hand-off fewer
                self._pool = ThreadPoolExecutor(len(self._blocks) - 1)
        else:
            # a LinearOperator cannot be scaled in place; apply the scaling around it
            self._scaled = None
            self._op, self._d = op, d

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        setattr(
            self.counters,
            self.field_name,
            getattr(self.counters, self.field_name) + _num_columns(x),
        )
        if self._blocks is not None:
            out = np.empty(x.shape, dtype=np.result_type(self._scaled.dtype, x.dtype))

            def block(lo, hi, rows):
                out[lo:hi] = rows @ x

            self._run_blocks(block)
            return out
        if self._scaled is not None:
            return self._scaled @ x
        assert self._d is not None  # set whenever _scaled is not
        d = self._d if x.ndim == 1 else self._d[:, None]
        return d * np.asarray(self._op @ (d * x))

    @property
    def supports_chebyshev_step(self) -> bool:
        return self._scaled is not None

    def chebyshev_step(self, cur: np.ndarray, prev: np.ndarray, out: np.ndarray,
                       center: float, factor: float, coefficient: float) -> np.ndarray:
        """One step of a Chebyshev series in B = (X - center) / half-width, fused per row block.

        Returns nxt = factor (X cur - center cur) - prev and adds coefficient * nxt to out
        in place. Each thread finishes its rows' vector updates right after its rows' SpMV,
        while they are still in cache, instead of five full-length passes afterwards.
        """
        self.counters_add(_num_columns(cur))
        nxt = np.empty(cur.shape, dtype=np.result_type(self._scaled.dtype, cur.dtype))

        def block(lo: int, hi: int, rows) -> None:
            y = rows @ cur
            y -= center * cur[lo:hi]
            y *= factor
            y -= prev[lo:hi]
            out[lo:hi] += coefficient * y
            nxt[lo:hi] = y

        if self._blocks is None:
            block(0, cur.shape[0], self._scaled)
        else:
            self._run_blocks(block)
        return nxt

    def _run_blocks(self, fn) -> None:
        """fn(lo, hi, rows) for every row block, the first one in the calling thread."""
        assert self._blocks is not None and self._pool is not None  # threaded operators only
        pending = [self._pool.submit(fn, *item) for item in self._blocks[1:]]
        fn(*self._blocks[0])
        for future in pending:
            future.result()

    def counters_add(self, columns: int) -> None:
        setattr(self.counters, self.field_name,
                getattr(self.counters, self.field_name) + columns)


class SerialSpace:
    """All n rows in one process: inner products are plain NumPy, with no communication.

    The interface the solver uses for every reduction and every random start vector, so that
    `furnace.eigen.distributed.DistributedSpace` can take the place of this one. Each method
    is the exact expression the serial solver had inline, so results stay bit-for-bit equal.

    Attributes:
        size: n, the global number of rows (equal to local_size here).
    """

    def __init__(self, size: int, threads: int = 1):
        self.size = int(size)
        self.local_size = self.size
        self.threads = int(threads)

    def dot(self, x: np.ndarray, y: np.ndarray):
        """X^T Y: a scalar for two vectors, (k,) or (k, l) for blocks."""
        return x.T @ y

    def norms(self, x: np.ndarray) -> np.ndarray:
        """2-norm of each column of an (n, k) block."""
        return np.linalg.norm(x, axis=0)

    def reduce(self, partial: np.ndarray) -> np.ndarray:
        """The sum over ranks of per-rank partial sums: the sums themselves on one rank."""
        return partial

    def restrict(self, x_global: np.ndarray) -> np.ndarray:
        """This process's rows of a global (n,) or (n, k) array: all of them."""
        return x_global

    def scaled_operator(self, op, d: np.ndarray, counters: Counters, field_name: str):
        """D op D on this process's rows, counting matvecs into counters.field_name."""
        return ScaledOperator(op, d, counters, field_name, threads=self.threads)


class Space(Protocol):
    """The rows a process holds and the reductions over them: `SerialSpace`, or
    `furnace.eigen.distributed.DistributedSpace` for rows split over ranks."""

    size: int
    local_size: int

    def dot(self, x: np.ndarray, y: np.ndarray, /) -> Any: ...

    def norms(self, x: np.ndarray, /) -> np.ndarray: ...

    def reduce(self, partial: np.ndarray, /) -> np.ndarray: ...

    def restrict(self, x_global: np.ndarray, /) -> np.ndarray: ...

    def scaled_operator(self, op: Any, d: np.ndarray, counters: Counters,
                        field_name: str, /) -> ScaledOperator: ...


class LumpedMass:
    """Diagonal mass operator: matvec and exact solve by the diagonal `diag`."""

    def __init__(self, diag: np.ndarray, counters: Counters):
        if np.any(diag <= 0):
            raise ValueError("lumped mass must have a positive diagonal (row sums > 0)")
        self.diag = np.asarray(diag, dtype=float)
        # after Jacobi scaling a lumped mass is exactly I: the filter then skips the solve
        self.is_identity = bool(np.all(self.diag == 1.0))
        self.shape = (self.diag.size, self.diag.size)
        self.counters = counters

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        self.counters.m_matvecs += _num_columns(x)
        return (self.diag if x.ndim == 1 else self.diag[:, None]) * x

    def solve(self, x: np.ndarray) -> np.ndarray:
        return x / (self.diag if x.ndim == 1 else self.diag[:, None])


class ChebyshevMassSolve:
    """Fixed-degree Chebyshev iteration x ~ M^-1 b for an SPD M with spectrum in [alpha, beta].

    Saad's recurrence (Iterative Methods, 2nd ed., p. 399) with x0 = 0: the error polynomial is
    T_k((theta - t)/delta) / T_k(theta/delta), so the residual falls by at least
    2 q^k with q = (sqrt(kappa) - 1) / (sqrt(kappa) + 1), kappa = beta / alpha. The map
    b -> x is a fixed polynomial in M, so it is linear, symmetric and (for valid bounds)
    positive definite: Lanczos in the inner product it defines stays exact.
    """

    def __init__(self, mass, alpha: float, beta: float, degree: int, counters: Counters):
        if not (0.0 < alpha < beta):
            raise ValueError(f"Chebyshev bounds need 0 < alpha < beta, got [{alpha}, {beta}]")
        if degree < 1:
            raise ValueError(f"Chebyshev degree must be >= 1, got {degree}")
        self.mass = mass
        self.alpha, self.beta, self.degree = float(alpha), float(beta), int(degree)
        self.shape = mass.shape
        self.counters = counters

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        # the wrapped mass operator counts its own matvecs
        return self.mass @ x

    def solve(self, rhs: np.ndarray) -> np.ndarray:
        theta = 0.5 * (self.alpha + self.beta)
        delta = 0.5 * (self.beta - self.alpha)
        sigma = theta / delta
        rho = 1.0 / sigma
        x = np.zeros_like(rhs, dtype=float)
        r = np.array(rhs, dtype=float)
        d = r / theta
        for _ in range(self.degree):
            x += d
            r -= self.mass @ d
            rho_next = 1.0 / (2.0 * sigma - rho)
            d = (rho_next * rho) * d + (2.0 * rho_next / delta) * r
            rho = rho_next
        return x

    @staticmethod
    def degree_for(kappa: float, rel_residual: float) -> int:
        """Smallest k with 2 q^k <= rel_residual, the textbook bound on ||r_k|| / ||b||."""
        q = (np.sqrt(kappa) - 1.0) / (np.sqrt(kappa) + 1.0)
        return int(np.ceil(np.log(rel_residual / 2.0) / np.log(q)))


# NormalModes' degree for P1 meshes (design note 1.2); enough for a Jacobi-scaled P1 mass
PEVSL_MASS_DEGREE = 25
# a Jacobi-scaled M with a Rayleigh quotient below this times its largest is singular to
# working precision (condition > 1e10): no Chebyshev mass solve of sane degree converges on it
MASS_SINGULAR = 1e-10


class IdentityMass:
    """M = I for standard problems: solve and matvec are copies and cost nothing."""

    def __init__(self, n: int):
        self.shape = (n, n)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        return x

    def solve(self, x: np.ndarray) -> np.ndarray:
        return x


@dataclass
class LanczosExtremes:
    """The extreme Ritz values of a short Lanczos run and the bounds widened around them.

    ritz_min and ritz_max are Rayleigh quotients, so they lie inside the spectrum: a
    ritz_min <= 0 proves that the operator has an eigenvalue <= 0.
    """

    ritz_min: float
    ritz_max: float
    lmin: float
    lmax: float


def lanczos_bounds(
    op,
    mass=None,
    *,
    num_steps: int = 100,
    seed: int = 0,
    margin: float = 1e-3,
    space: Space | None = None,
) -> tuple[float, float]:
    """Estimate [lmin, lmax] of mass^-1 op (see `lanczos_extremes`)."""
    found = lanczos_extremes(op, mass, num_steps=num_steps, seed=seed, margin=margin,
                             space=space)
    return found.lmin, found.lmax


def lanczos_extremes(
    op,
    mass=None,
    *,
    num_steps: int = 100,
    seed: int = 0,
    margin: float = 1e-3,
    space: Space | None = None,
) -> LanczosExtremes:
    """Estimate [lmin, lmax] of mass^-1 op by Lanczos with full reorthogonalisation.

    The Ritz extremes are widened by the residual norms |beta_k y_k[-1]| of the extreme
    Ritz pairs (the Kahan-Parlett interval holding an eigenvalue) and by `margin` times the
    estimated width, so that Chebyshev polynomials on the result do not see eigenvalues
    outside [-1, 1].

    Args:
        op: symmetric operator with `@` (the scaled A, or the scaled M itself).
        mass: object with `@` and `solve` defining the inner product; None for the identity.
        num_steps: Lanczos steps, capped at n.
        space: where the vectors live and how their inner products are summed; None is
            `SerialSpace` of op's size.
    Returns:
        `LanczosExtremes`.
    """
    if space is None:
        space = SerialSpace(op.shape[0])
    n = space.local_size
    if mass is None:
        mass = IdentityMass(n)
    num_steps = max(2, min(num_steps, space.size))
    rng = np.random.default_rng(seed)
    v = space.restrict(rng.standard_normal(space.size))
    z = mass @ v
    norm = np.sqrt(space.dot(v, z))
    basis_v = np.zeros((n, num_steps))
    basis_z = np.zeros((n, num_steps))
    basis_v[:, 0], basis_z[:, 0] = v / norm, z / norm
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(num_steps):
        z_new = op @ basis_v[:, j]
        alpha = space.dot(basis_v[:, j], z_new)
        z_new -= alpha * basis_z[:, j]
        if j > 0:
            z_new -= betas[-1] * basis_z[:, j - 1]
        for _ in range(2):
            z_new -= basis_z[:, : j + 1] @ space.dot(basis_v[:, : j + 1], z_new)
        v_new = mass.solve(z_new)
        beta = np.sqrt(max(space.dot(v_new, z_new), 0.0))
        alphas.append(alpha)
        if j == num_steps - 1 or beta <= 1e-14 * max(abs(alpha), 1.0):
            break
        betas.append(beta)
        basis_v[:, j + 1], basis_z[:, j + 1] = v_new / beta, z_new / beta
    ritz, vecs = scipy.linalg.eigh_tridiagonal(np.array(alphas), np.array(betas[: len(alphas) - 1]))
    residual = abs(beta * vecs[-1, :])
    width = ritz[-1] - ritz[0]
    lmin = ritz[0] - residual[0] - margin * width
    lmax = ritz[-1] + residual[-1] + margin * width
    return LanczosExtremes(float(ritz[0]), float(ritz[-1]), float(lmin), float(lmax))


class MassOperator(Protocol):
    """M~ as the solver uses it: products M~ x and solves M~^-1 x (`LumpedMass`,
    `ChebyshevMassSolve`, `IdentityMass`)."""

    def __matmul__(self, x: np.ndarray, /) -> np.ndarray: ...

    def solve(self, x: np.ndarray, /) -> np.ndarray: ...


@dataclass
class ScaledPencil:
    """The Jacobi-scaled pencil (A~, M~) = (D A D, D M D) with its mass solver and bounds.

    Eigenvectors map back as x = D x~; x~ M~-orthonormal implies x M-orthonormal. With a
    `DistributedSpace` the operators, the scaling and all vectors hold this rank's rows only.
    """

    a_op: ScaledOperator
    mass: MassOperator
    scaling: np.ndarray
    lmin: float
    lmax: float
    mass_bounds: tuple[float, float] | None
    counters: Counters
    # None only until __post_init__ puts the serial space in
    space: Space = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.space is None:
            self.space = SerialSpace(self.scaling.size)

    @property
    def n(self) -> int:
        """Rows held here (n on one rank, the local rows with a `DistributedSpace`)."""
        return self.scaling.size

    def apply_minv_a(self, x: np.ndarray) -> np.ndarray:
        """M~^-1 A~ x, the operator whose spectrum is the pencil's."""
        if getattr(self.mass, "is_identity", False):
            return self.a_op @ x
        return self.mass.solve(self.a_op @ x)

    def filter_operator(self):
        """What the filter applies: A~ itself when M~ = I and A~ can fuse a Chebyshev step
        (see ScaledOperator.chebyshev_step), else the callable `apply_a_minv`."""
        if getattr(self.mass, "is_identity", False) and getattr(
                self.a_op, "supports_chebyshev_step", False):
            return self.a_op
        return self.apply_a_minv

    def apply_a_minv(self, z: np.ndarray) -> np.ndarray:
        """A~ M~^-1 z, the same operator acting on Z = M~ V (pEVSL's form)."""
        if getattr(self.mass, "is_identity", False):
            return self.a_op @ z
        return self.a_op @ self.mass.solve(z)


def scale_pencil(
    A, M, config, counters: Counters | None = None, *, space: Space | None = None
) -> ScaledPencil:
    """Jacobi-scale (A, M), build the mass solver of `config.mass`, estimate [lmin, lmax].

    M = None means the standard problem (M = I). `space` (default `SerialSpace`) decides
    which rows this process keeps; the scaling and the lumped diagonal are row-local, so they
    are computed on the whole pencil and restricted. A `DistributedSpace` counts its
    allreduces into its own Counters: pass the same object as `counters`.
    """
    counters = Counters() if counters is None else counters
    n = check_square(A, "A")
    if M is not None and check_square(M, "M") != n:
        raise ValueError(f"A and M must have the same shape, got {A.shape} and {M.shape}")
    space = SerialSpace(n, threads=config.threads) if space is None else space
    if space.size != n:
        raise ValueError(f"the space has {space.size} rows, the pencil {n}")
    mass_bounds: tuple[float, float] | None = None
    mass: MassOperator
    if M is None:
        scaling = np.ones(n)
        mass = IdentityMass(space.local_size)
    elif config.mass == "lumped" or is_diagonal(M):
        diag = row_sums(M) if config.mass == "lumped" else operator_diagonal(M)
        if not np.all(diag > 0):
            raise PencilError("M", "M must have a positive diagonal (row sums for "
                              "mass='lumped')")
        # after scaling by diag^-1/2 the lumped mass is exactly the identity
        scaling = 1.0 / np.sqrt(diag)
        mass = LumpedMass(np.ones(space.local_size), counters)
    else:
        diag = operator_diagonal(M)
        if not np.all(diag > 0):
            raise PencilError("M", "M is not positive definite: its diagonal has entries <= 0")
        scaling = 1.0 / np.sqrt(diag)
        scaled_mass = space.scaled_operator(M, scaling, counters, "m_matvecs")
        if config.mass_bounds is not None:
            alpha, beta = config.mass_bounds
            mass_bounds = (float(alpha), float(beta))
        else:
            found = lanczos_extremes(scaled_mass, num_steps=config.bound_steps,
                                     seed=config.seed, space=space)
            # a Ritz value is a Rayleigh quotient: one <= 0 proves M indefinite or singular,
            # and one below MASS_SINGULAR times the largest makes M numerically singular
            if found.ritz_min <= MASS_SINGULAR * abs(found.ritz_max):
                raise PencilError("M", "M is not positive definite: the Jacobi-scaled M has "
                                  f"the Rayleigh quotient {found.ritz_min:.3g} (largest "
                                  f"{found.ritz_max:.3g})")
            lo, hi = found.lmin, found.lmax
            # the Ritz minimum converges from above; never let alpha reach 0
            mass_bounds = (lo, hi) if lo > 0 else (1e-3 * hi, hi)
        degree = config.cheb_mass_degree or PEVSL_MASS_DEGREE
        kappa = mass_bounds[1] / mass_bounds[0]
        if (config.cheb_mass_degree is None
                and 2.0 * ((np.sqrt(kappa) - 1.0) / (np.sqrt(kappa) + 1.0)) ** degree > 1e-10):
            # pEVSL's degree 25 assumes a Jacobi-scaled P1 mass (kappa <= 5); a worse
            # conditioned M would make every Lanczos step inexact and the run crawl
            degree = ChebyshevMassSolve.degree_for(kappa, 1e-12)
            warnings.warn(f"the Jacobi-scaled M has condition {kappa:.3g}: degree "
                          f"{PEVSL_MASS_DEGREE} of the Chebyshev mass solve would not reach "
                          f"1e-10, using degree {degree}", stacklevel=3)
        mass = ChebyshevMassSolve(
            scaled_mass, mass_bounds[0], mass_bounds[1], degree, counters
        )
    a_op = space.scaled_operator(A, scaling, counters, "a_matvecs")
    lmin, lmax = lanczos_bounds(a_op, mass, num_steps=config.bound_steps, seed=config.seed + 1,
                                space=space)
    return ScaledPencil(a_op, mass, space.restrict(scaling), lmin, lmax, mass_bounds, counters,
                        space)
