"""`furnace reproduce eigen`: the filtered Lanczos solver on the homogeneous ball.

- ``lamb``: the P1 ball's five lowest multiplets against Lamb (1882) under mesh
  refinement, with the observed convergence rate (consistent and lumped mass).
- ``vs_arpack``: filtered Lanczos (lumped mass) against ARPACK shift-invert on the same
  pencil at growing sizes, side by side in one run: time, memory counts, matvecs, and the
  crossover size.

The SC18 scaling tests, the unified-time metric and the Mars maps are not registered yet.
"""

from __future__ import annotations

import time

import numpy as np

from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table

# omega * a / beta of Lamb's Poisson-solid modes in omega in [2, 4.2] (design note 4.1)
LAMB = (("0T2", 2.50113, 5), ("0S2", 2.63987, 5), ("1S1", 3.42453, 3), ("0T3", 3.86470, 7),
        ("0S3", 3.91634, 7))
INTERVAL = (4.0, 4.2**2)


def _ball(h: float, lumped: bool):
    from furnace.normal_modes.assembly import assemble, homogeneous
    from furnace.normal_modes.mesh import ball_mesh

    # unit ball with beta = 1, so omega * a / beta = sqrt(lambda)
    return assemble(ball_mesh(1.0, h), homogeneous(1.0, 3**0.5, 1.0), lumped=lumped)


def _multiplet_errors(omegas: np.ndarray) -> list[float]:
    """Max |relative error| per multiplet, assigning the sorted eigenvalues in Lamb's order
    (5, 5, 3, 7, 7); NaN for multiplets that fell outside the interval."""
    errors, start = [], 0
    for _, ref, mult in LAMB:
        part = np.sort(omegas)[start:start + mult]
        errors.append(float(np.abs(part / ref - 1).max()) if part.size == mult
                      else float("nan"))
        start += mult
    return errors


def lamb(ctx: RunContext) -> Result:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .config import SolverConfig
    from .solver import eigsh_interval

    sizes = (0.25, 0.15) if ctx.quick else (0.25, 0.15, 0.1, 0.07)
    rows, curves = [], {}
    for lumped in (True, False):
        label = "lumped" if lumped else "consistent"
        curves[label] = []
        for h in sizes:
            ctx.progress(f"{label} mass, h={h}")
            K, M = _ball(h, lumped)
            a, b = INTERVAL
            res = eigsh_interval(K, M, a, b, config=SolverConfig(
                a=a, b=b, mass="lumped" if lumped else "consistent"))
            omegas = np.sqrt(res.eigenvalues)
            errors = _multiplet_errors(omegas)
            curves[label].append(errors[0])
            rows.append([label, h, K.shape[0], omegas.size, *[100 * e for e in errors],
                         res.counters.filter_degree])
    rates = {k: float(np.log(v[0] / v[-1]) / np.log(sizes[0] / sizes[-1]))
             for k, v in curves.items()}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, errs in curves.items():
        ax.loglog(sizes, errs, "-o", label=f"{label} mass (rate {rates[label]:.2f})")
    ax.set(xlabel="mesh size h (unit ball)", ylabel="|relative error| of 0T2",
           title="P1 ball vs Lamb (filtered Lanczos)")
    ax.legend()
    return Result(
        tables=[Table(title="Five lowest multiplets of the P1 ball against Lamb (max |error| %)",
                      columns=["mass", "h", "unknowns", "eigenpairs", *[n for n, _, _ in LAMB],
                               "filter degree"], rows=rows, kind="measured",
                      note="omega in [2, 4.2] on a unit ball with vp = sqrt(3), vs = 1, rho = 1 "
                      "(omega a / beta = sqrt(lambda)); sorted eigenvalues are assigned to "
                      "Lamb's multiplets in order; n/a where a multiplet fell outside the "
                      "interval.")],
        figures=[ctx.save_figure(fig, "eigen_lamb_convergence")],
        claims=[Claim(what="observed convergence rate of 0T2, P1 consistent mass",
                      paper="2 (theory, O(h^2) eigenvalue error)",
                      ours=f"{rates['consistent']:.2f}", kind="measured")],
        data={"sizes": sizes, "errors": curves, "rates": rates})


def vs_arpack(ctx: RunContext) -> Result:
    import scipy.sparse.linalg as sla

    from .config import SolverConfig
    from .solver import eigsh_interval

    sizes = (0.25, 0.15, 0.1) if ctx.quick else (0.25, 0.15, 0.1, 0.07, 0.05)
    a, b = INTERVAL
    rows, crossover = [], None
    for h in sizes:
        ctx.progress(f"h={h}")
        K, M = _ball(h, lumped=True)
        n = K.shape[0]
        t0 = time.perf_counter()
        res = eigsh_interval(K, M, a, b, config=SolverConfig(a=a, b=b, mass="lumped"))
        t_filter = time.perf_counter() - t0
        t0 = time.perf_counter()
        sigma = 0.5 * (a + b)
        # a symmetric fill-reducing ordering; SuperLU's default COLAMD is poor here
        lu = sla.splu((K - sigma * M).tocsc(), permc_spec="MMD_AT_PLUS_A",
                      options={"SymmetricMode": True})
        op = sla.LinearOperator(K.shape, matvec=lu.solve, dtype=float)
        k = min(n - 2, res.eigenvalues.size + 12)
        vals = sla.eigsh(K, k=k, M=M, sigma=sigma, OPinv=op, return_eigenvectors=False)
        t_arpack = time.perf_counter() - t0
        vals = np.sort(vals[(vals >= a) & (vals <= b)])
        same = vals.size == res.eigenvalues.size and np.allclose(vals, res.eigenvalues,
                                                                 rtol=1e-8)
        factor_bytes = 12 * (lu.L.nnz + lu.U.nnz)
        basis_bytes = res.counters.peak_basis_bytes
        speedup = t_arpack / t_filter
        if crossover is None and speedup > 1:
            crossover = n
        rows.append([h, n, res.eigenvalues.size, "yes" if same else "NO", t_filter, t_arpack,
                     speedup, basis_bytes / 2**20, factor_bytes / 2**20,
                     res.counters.a_matvecs])
    last = rows[-1]
    return Result(
        tables=[Table(title="Filtered Lanczos (lumped) vs ARPACK shift-invert, same pencil",
                      columns=["h", "unknowns", "eigenpairs", "same eigenvalues",
                               "filtered s", "ARPACK s", "speedup", "Krylov basis MiB",
                               "LU factor MiB", "A matvecs"], rows=rows, kind="measured",
                      note="Memory columns are counts, not process peaks: the Krylov basis "
                      "(V and Z, float64) against the LU factor (L+U nonzeros x 12 B). "
                      "Times are wall clock on this shared 2-core machine, one run.")],
        claims=[Claim(what=f"speedup over ARPACK shift-invert at {last[1]} unknowns",
                      paper=">= 3x at about 80k unknowns (issue target)",
                      ours=f"{last[6]:.2f}x", kind="measured",
                      holds=(last[6] >= 3.0) if last[1] > 60_000 else None),
                 Claim(what="crossover size (filtered Lanczos faster)", paper="-",
                       ours=f"{crossover} unknowns" if crossover else "not reached",
                       kind="measured")],
        data={"rows": rows, "crossover": crossover})


EXPERIMENTS = [
    Experiment("eigen", "lamb", "P1 ball against Lamb under refinement", lamb),
    Experiment("eigen", "vs_arpack", "Filtered Lanczos vs ARPACK shift-invert", vs_arpack),
]
