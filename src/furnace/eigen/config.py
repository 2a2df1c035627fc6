"""Configuration of the polynomial-filtered Lanczos eigensolver (dataclasses only).

The defaults are the constants of pEVSL's ChebLanNr as called by NormalModes (Shi, Li, Xi,
Saad, de Hoop, SC'18, section IV; Li, Xi, Erlandson, Saad, "The eigenvalues slicing library
(EVSL)", SIAM J. Sci. Comput. 2019, sections 3-4): degree-25 Chebyshev iteration for the
mass matrix, filter thresholds 0.8 (interior) and 0.7 (end intervals), Lanczos sigma damping,
trace test every 20 steps from step 30 with tolerance 2e-12.

The completeness settings (count_check, inertia_max_n, max_restarts, slice_capacity,
allow_incomplete) are this package's own: pEVSL trusts its trace test, which once returned
611 of 989 eigenvalues as converged (see README.md, "Completeness").

The fields that `furnace eigen solve` sets carry their option's help in
``metadata["help"]`` (`furnace.runtime.cliargs.add_config_arguments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MASS_KINDS = ("consistent", "lumped")
DAMPING_KINDS = ("sigma", "jackson", "none")
COUNT_CHECKS = ("auto", "inertia", "dos")
# largest n that count_check="auto" factorises
INERTIA_MAX_N = 20_000


@dataclass(kw_only=True)
class SolverConfig:
    """Settings of `eigsh_interval` for the pencil A x = lambda M x on [a, b].

    Args:
        a, b: the search interval [a, b], a < b.
        mass: "consistent" applies M^-1 by Chebyshev iteration; "lumped" replaces M by the
            diagonal of its row sums (a different discrete problem).
        cheb_mass_degree: fixed degree of the Chebyshev iteration for the Jacobi-scaled M;
            None takes pEVSL's 25, raised (with a warning) when the estimated condition of
            M needs more to reach 1e-10; an explicit degree is used as given.
        mass_bounds: (alpha, beta) enclosing the spectrum of the Jacobi-scaled M; None
            estimates them by a short Lanczos run.
        thresh_int: filter value at a and b relative to the peak, interior intervals.
        thresh_ext: the same for intervals that touch an end of the spectrum.
        damping: Gibbs damping of the Chebyshev series.
        max_degree: largest filter degree the degree search may reach.
        max_lanczos_steps: cap on the Krylov dimension; None means min(n, 2000).
        tol: relative residual tol, ||A u - rho M u|| <= tol * max(|a|, |b|, |rho|) ||M u||.
        trace_tol: stop when the restricted trace of T_k changes by less than this.
        seed: seed of the random starting vectors.
        check_every: steps between convergence tests.
        min_steps: first step at which convergence is tested.
        bound_steps: Lanczos steps used to estimate spectral bounds.
        threads: threads for the sparse matrix-vector products of one process (row blocks
            multiplied concurrently; 1 = plain SciPy). MPI runs split rows over ranks
            instead.
        count_check: how the number of eigenvalues in each slice is vouched for. "inertia":
            exactly, by Sylvester's law of inertia (sparse LDL^T of A - sigma M at every
            slice end; needs A and M as matrices). "dos": by the KPM estimate within its
            stated tolerance, plus a deflated Lanczos run that must find nothing new.
            "auto": inertia when A and M are matrices with n <= inertia_max_n, else dos.
        inertia_max_n: largest n for which "auto" factorises (the LDL^T of a 3-D problem
            fills in like n^(4/3) and costs like n^2).
        max_restarts: deflated restarts per slice (Lanczos from a fresh vector, orthogonal
            to the pairs already found): they find the missing copies of repeated eigenvalues
            and whatever a run stopped short of.
        slice_capacity: most eigenvalues one slice may hold; an interval estimated to hold
            more is sliced further on its own. None means max_lanczos_steps // 4 (with its
            default, min(n, 2000) // 4).
        allow_incomplete: False (default) raises `IncompleteError` when the solver cannot
            vouch for the count; True returns the result with complete=False instead.
    """

    a: float
    b: float
    mass: str = "consistent"
    cheb_mass_degree: int | None = None
    mass_bounds: tuple[float, float] | None = None
    thresh_int: float = 0.8
    thresh_ext: float = 0.7
    damping: str = "sigma"
    max_degree: int = 10000
    max_lanczos_steps: int | None = field(default=None, metadata={
        "help": "cap on the Krylov dimension of one run (default: min(n, 2000))"})
    tol: float = field(default=1e-10, metadata={"help": "relative residual tolerance"})
    trace_tol: float = 2e-12
    seed: int = 0
    check_every: int = 20
    min_steps: int = 30
    bound_steps: int = 100
    threads: int = field(default=1, metadata={
        "help": "threads for the sparse products of each process"})
    count_check: str = field(default="auto", metadata={
        "help": "vouch for the count by Sylvester inertia (exact, sparse LDL^T), by the KPM "
        f"estimate and a deflated rerun, or auto: inertia up to {INERTIA_MAX_N} unknowns "
        "(default: auto)", "choices": COUNT_CHECKS})
    inertia_max_n: int = INERTIA_MAX_N
    max_restarts: int = field(default=12, metadata={
        "help": "deflated Lanczos restarts per slice: they find the missing copies of "
        "repeated eigenvalues and confirm that nothing is left"})
    slice_capacity: int | None = None
    allow_incomplete: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ValueError(f"the interval [a, b] must have finite ends, got a={self.a}, "
                             f"b={self.b}")
        if not (self.a < self.b):
            raise ValueError(f"need a < b for the interval [a, b], got a={self.a}, b={self.b}")
        if not 0.0 < self.tol < 1.0:
            raise ValueError(f"tol must lie in (0, 1), got {self.tol}")
        if not self.trace_tol > 0.0:
            raise ValueError(f"trace_tol must be > 0, got {self.trace_tol}")
        if self.count_check not in COUNT_CHECKS:
            raise ValueError(f"count_check must be one of {COUNT_CHECKS}, got "
                             f"{self.count_check!r}")
        if self.max_lanczos_steps is not None and self.max_lanczos_steps < 1:
            raise ValueError(f"max_lanczos_steps must be >= 1, got {self.max_lanczos_steps}")
        if self.max_restarts < 0 or self.inertia_max_n < 0:
            raise ValueError("max_restarts and inertia_max_n must be >= 0")
        if self.slice_capacity is not None and self.slice_capacity < 1:
            raise ValueError(f"slice_capacity must be >= 1, got {self.slice_capacity}")
        if self.mass not in MASS_KINDS:
            raise ValueError(f"mass must be one of {MASS_KINDS}, got {self.mass!r}")
        if self.damping not in DAMPING_KINDS:
            raise ValueError(f"damping must be one of {DAMPING_KINDS}, got {self.damping!r}")
        if self.cheb_mass_degree is not None and self.cheb_mass_degree < 1:
            raise ValueError(f"cheb_mass_degree must be >= 1, got {self.cheb_mass_degree}")
        if not (0.0 < self.thresh_int < 1.0 and 0.0 < self.thresh_ext < 1.0):
            raise ValueError("thresh_int and thresh_ext must lie in (0, 1)")
        if self.mass_bounds is not None:
            lo, hi = self.mass_bounds
            if not (0.0 < lo < hi):
                raise ValueError(
                    f"mass_bounds must satisfy 0 < alpha < beta, got {self.mass_bounds}"
                )
        if self.max_degree < 2:
            raise ValueError(f"max_degree must be >= 2, got {self.max_degree}")
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.check_every < 1 or self.min_steps < 1 or self.bound_steps < 2:
            raise ValueError("check_every, min_steps must be >= 1 and bound_steps >= 2")
