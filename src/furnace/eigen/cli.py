"""`furnace eigen solve`: eigenpairs of a Matrix Market pencil in an interval.

    furnace eigen solve A.mtx [--mass M.mtx] --interval A B [--slices S] [--lumped]
    mpiexec -n P furnace eigen solve A.mtx --mass M.mtx --interval A B   (slices over ranks)
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> None:
    eig = subparsers.add_parser("eigen", help="polynomial-filtered Lanczos eigensolver")
    sub = eig.add_subparsers(dest="eigen_command", metavar="COMMAND")
    eig.set_defaults(func=lambda args: (eig.print_help(), 0)[1])
    solve = sub.add_parser("solve", help="eigenpairs of A x = lambda M x in [a, b]")
    solve.add_argument("matrix", help="A, a Matrix Market file")
    solve.add_argument("--mass", help="M, a Matrix Market file (default: identity)")
    solve.add_argument("--interval", nargs=2, type=float, required=True, metavar=("A", "B"))
    solve.add_argument("--slices", type=int, default=None,
                       help="spectrum slices (default: 1, or the number of MPI ranks)")
    solve.add_argument("--lumped", action="store_true", help="lump M by row sums")
    solve.add_argument("--tol", type=float, default=1e-10)
    solve.add_argument("--json", help="write eigenvalues, residuals and counters here")
    solve.set_defaults(func=_solve)


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _solve(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from .config import SolverConfig
    from .solver import eigsh_interval, load_pencil

    a, b = args.interval
    try:
        A, M = load_pencil(args.matrix, args.mass)
        config = SolverConfig(a=a, b=b, mass="lumped" if args.lumped else "consistent",
                              tol=args.tol)
    except (OSError, ValueError) as exc:
        print(f"furnace eigen solve: {exc}", file=sys.stderr)
        return 2
    comm = _mpi_world()
    if comm is not None:
        from .parallel import eigsh_interval_mpi

        result = eigsh_interval_mpi(A, M, a, b, comm=comm, config=config, slices=args.slices)
        rank, size = comm.Get_rank(), comm.Get_size()
    else:
        result = eigsh_interval(A, M, a, b, config=config, slices=args.slices or 1)
        rank, size = 0, 1
    if rank != 0:
        return 0
    print(f"{result.eigenvalues.size} eigenvalues in [{a:g}, {b:g}] "
          f"({size} rank{'s' if size > 1 else ''}, {len(result.slices)} slice(s)):")
    for value, res in zip(result.eigenvalues, result.residuals):
        print(f"  {value:.15g}   residual {res:.1e}")
    c = result.counters
    print(f"filter degree {c.filter_degree}, Lanczos steps {c.lanczos_steps}, "
          f"A matvecs {c.a_matvecs}, M matvecs {c.m_matvecs} (rank 0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"eigenvalues": result.eigenvalues.tolist(),
                       "residuals": result.residuals.tolist(), "ranks": size,
                       "counters": asdict(c)}, f, indent=2)
    return 0
