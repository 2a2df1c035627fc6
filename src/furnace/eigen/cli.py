"""`furnace eigen solve`: eigenpairs of a Matrix Market pencil in an interval.

The command-line driver of the pEVSL-style solver (Shi, Li, Xi, Saad, de Hoop, SC'18, section
IV; the parallel modes of section IV.D are described in `furnace.eigen.parallel`):

    furnace eigen solve A.mtx [--mass M.mtx] --interval A B [--slices S] [--lumped]
    mpiexec -n P furnace eigen solve A.mtx --mass M.mtx --interval A B
        [--mode slices|rows|groups] [--group-size G]
    mpiexec -n P python -m furnace.eigen.cli eigen solve ...    (the same, without the
        `furnace` command's start-up: it imports the shared runtime, torch, on every rank)

``--json`` writes the eigenvalues, residuals, the mode, the wall time of the solve alone
(rank 0, between barriers) and the counters of rank 0 and of every rank.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_parser(subparsers) -> None:
    eig = subparsers.add_parser("eigen", help="polynomial-filtered Lanczos eigensolver")
    sub = eig.add_subparsers(dest="eigen_command", metavar="COMMAND")
    eig.set_defaults(func=lambda args: (eig.print_help(), 0)[1])
    solve = sub.add_parser("solve", help="eigenpairs of A x = lambda M x in [a, b]")
    solve.add_argument("matrix", help="A, a Matrix Market file")
    solve.add_argument("--mass", help="M, a Matrix Market file (default: identity)")
    solve.add_argument("--interval", nargs=2, type=float, required=True, metavar=("A", "B"))
    solve.add_argument("--slices", type=int, default=None,
                       help="spectrum slices (default: 1, or the number of rank groups)")
    solve.add_argument("--lumped", action="store_true", help="lump M by row sums")
    solve.add_argument("--mode", choices=("slices", "rows", "groups"), default="slices",
                       help="under mpiexec: slices over ranks, rows of each slice over all "
                       "ranks, or groups of --group-size ranks per slice (default: slices)")
    solve.add_argument("--group-size", type=int, default=None,
                       help="ranks per group for --mode groups")
    solve.add_argument("--tol", type=float, default=1e-10)
    solve.add_argument("--threads", type=int, default=1,
                       help="threads for the sparse products of each process (default 1)")
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
    from .parallel import ParallelLayout
    from .solver import eigsh_interval, load_pencil

    a, b = args.interval
    comm = _mpi_world()
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    try:
        layout = ParallelLayout(args.mode, size, args.group_size)
        A, M = load_pencil(args.matrix, args.mass)
        config = SolverConfig(a=a, b=b, mass="lumped" if args.lumped else "consistent",
                              tol=args.tol, threads=args.threads)
    except (OSError, ValueError) as exc:
        if rank == 0:
            print(f"furnace eigen solve: {exc}", file=sys.stderr)
        return 2
    if comm is not None:
        from .parallel import eigsh_interval_mpi

        comm.Barrier()
        start = time.perf_counter()
        try:
            result = eigsh_interval_mpi(A, M, a, b, comm=comm, config=config,
                                        slices=args.slices, mode=layout.mode,
                                        group_size=args.group_size)
        except ValueError as exc:
            # raised on every rank alike, so no rank is left waiting in a collective
            if rank == 0:
                print(f"furnace eigen solve: {exc}", file=sys.stderr)
            return 2
        comm.Barrier()
        seconds = time.perf_counter() - start
        rank_counters = comm.gather(asdict(result.counters))
    else:
        # one rank: every mode is the serial solver
        from rich.console import Console

        start = time.perf_counter()
        # the spinner goes to stderr, so that stdout stays the plain list of eigenvalues
        with Console(stderr=True).status("filtered Lanczos ...") as status:
            result = eigsh_interval(A, M, a, b, config=config, slices=args.slices or 1,
                                    progress=lambda text: status.update(text))
        seconds = time.perf_counter() - start
        rank_counters = [asdict(result.counters)]
    if rank != 0:
        return 0
    print(f"{result.eigenvalues.size} eigenvalues in [{a:g}, {b:g}] "
          f"({size} rank{'s' if size > 1 else ''}, mode {layout.mode}, group size "
          f"{layout.group_size}, {len(result.slices)} slice(s), {seconds:.3g} s):")
    for value, res in zip(result.eigenvalues, result.residuals):
        print(f"  {value:.15g}   residual {res:.1e}")
    c = result.counters
    print(f"filter degree {c.filter_degree}, Lanczos steps {c.lanczos_steps}, "
          f"A matvecs {c.a_matvecs}, M matvecs {c.m_matvecs}, halo bytes {c.halo_bytes}, "
          f"allreduces {c.allreduces} (rank 0)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"eigenvalues": result.eigenvalues.tolist(),
                       "residuals": result.residuals.tolist(), "ranks": size,
                       "mode": layout.mode, "group_size": layout.group_size,
                       "slices": len(result.slices), "seconds": seconds,
                       "counters": asdict(c), "rank_counters": rank_counters}, f, indent=2)
    return 0


def main(argv=None) -> int:
    """``furnace eigen ...`` with only this subcommand loaded."""
    parser = argparse.ArgumentParser(prog="furnace")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
