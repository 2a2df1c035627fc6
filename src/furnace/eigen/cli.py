"""`furnace eigen solve`: eigenpairs of a Matrix Market pencil in an interval.

The command-line driver of the pEVSL-style solver (Shi, Li, Xi, Saad, de Hoop, SC'18, section
IV; the parallel modes of section IV.D are described in `furnace.eigen.parallel`):

    furnace eigen solve A.mtx [--mass M.mtx] --interval A B [--slices S] [--lumped]
    mpiexec -n P furnace eigen solve A.mtx --mass M.mtx --interval A B
        [--mode slices|rows|groups] [--group-size G]
    mpiexec -n P python -m furnace.eigen.cli eigen solve ...    (the same command)

It prints the eigenvalues, then one line per slice with the expected count (Sylvester's
inertia or the KPM estimate), the count found, and whether the slice converged and is
complete. ``--json`` writes the same (atomically, rank 0) with the residuals, the mode, the
wall time of the solve alone (between barriers) and the counters of rank 0 and of every rank.

Exit status: 0 when every eigenvalue in [A, B] was found and the count vouched for; 1 when
the solver cannot vouch for the count (the report and one line on stderr say which slice and
why) or an output cannot be written; 2 for a usage error (a bad argument or a matrix that is
not real, finite, symmetric, with M positive definite), caught before any solve starts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING

from furnace.runtime.atomic import OutputError, atomic_write_text
from furnace.runtime.cliargs import (
    Parser,
    UsageError,
    add_config_arguments,
    config_from_args,
    float_in,
    input_file,
    nonnegative_int,
    output_file,
    positive_int,
)

from .config import SolverConfig

if TYPE_CHECKING:
    from rich.status import Status

MODES = ("slices", "rows", "groups")
# the exit status of a solve that ran but cannot vouch for the number of eigenvalues found
EXIT_INCOMPLETE = 1
_EPILOG = ("exit status: 0 every eigenvalue in [A, B] found and the count vouched for; 1 the "
           "count could not be vouched for (see the per-slice report) or an output could not "
           "be written; 2 a usage error")


def add_parser(subparsers) -> None:
    eig = subparsers.add_parser("eigen", help="polynomial-filtered Lanczos eigensolver")
    sub = eig.add_subparsers(dest="eigen_command", metavar="COMMAND")
    eig.set_defaults(func=lambda args: (eig.print_help(), 0)[1])
    solve = sub.add_parser("solve", help="eigenpairs of A x = lambda M x in [a, b]",
                           epilog=_EPILOG)
    solve.add_argument("matrix", type=input_file, help="A, a Matrix Market file")
    solve.add_argument("--mass", type=input_file, default=None,
                       help="M, a Matrix Market file (default: identity)")
    solve.add_argument("--interval", nargs=2, type=float_in(), required=True, metavar=("A", "B"),
                       help="the interval [A, B]: finite, A < B")
    solve.add_argument("--slices", type=positive_int, default=None,
                       help="least number of spectrum slices; more are made when [A, B] holds "
                       "more eigenvalues than one slice takes (default: 1, or the number of "
                       "rank groups)")
    solve.add_argument("--lumped", action="store_true", help="lump M by row sums")
    solve.add_argument("--mode", choices=MODES, default="slices",
                       help="under mpiexec: slices over ranks, rows of each slice over all "
                       "ranks, or groups of --group-size ranks per slice (default: slices)")
    solve.add_argument("--group-size", type=positive_int, default=None,
                       help="ranks per group for --mode groups (default: none)")
    # the solver's own settings: options declared from the SolverConfig fields
    add_config_arguments(
        solve, SolverConfig, ["tol", "threads", "count_check", "max_lanczos_steps",
                              "max_restarts"],
        overrides={"tol": {"type": float_in(0.0, 1.0, lo_open=True, hi_open=True)},
                   "threads": {"type": positive_int},
                   "max_lanczos_steps": {"type": positive_int},
                   "max_restarts": {"type": nonnegative_int}})
    solve.add_argument("--json", type=output_file, default=None,
                       help="write eigenvalues, the slice report and counters here "
                       "(default: none)")
    solve.set_defaults(func=_solve)


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _solve(args: argparse.Namespace) -> int:
    comm = _mpi_world()
    rank = 0 if comm is None else comm.Get_rank()
    prog = getattr(args, "_prog", None) or "furnace eigen solve"
    try:
        return _run(args, comm)
    except UsageError as exc:
        # raised on every rank alike (every rank reads and checks the same files): one line
        if rank == 0:
            print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OutputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


def _config(args: argparse.Namespace) -> SolverConfig:
    a, b = args.interval
    if not a < b:
        raise UsageError("--interval", f"must satisfy A < B, got A={a:g}, B={b:g}")
    # args.mass is the --mass file, not the field: the field follows --lumped
    return config_from_args(SolverConfig, args, a=a, b=b,
                            mass="lumped" if args.lumped else "consistent",
                            allow_incomplete=True)


def _layout(args: argparse.Namespace, size: int):
    from .parallel import ParallelLayout

    try:
        return ParallelLayout(args.mode, size, args.group_size)
    except ValueError as exc:
        raise UsageError("--group-size", f"{exc} (--mode {args.mode})") from None


def _pencil_error(exc, args: argparse.Namespace) -> UsageError:
    """A `PencilError` as the usage error of the argument that named the file."""
    path = str(args.matrix if exc.matrix == "A" else args.mass)
    text = str(exc) if path in str(exc) else f"{exc} (in {path})"
    return UsageError("matrix" if exc.matrix == "A" else "--mass", text)


class _Status:
    """A progress line on stderr, started on the first progress report (so that a pencil
    rejected before the solve leaves stderr with its one error line)."""

    def __init__(self) -> None:
        self._context: Status | None = None
        self._status: Status | None = None

    def __call__(self, text: str) -> None:
        if self._status is None:
            from rich.console import Console

            self._context = Console(stderr=True).status("filtered Lanczos ...")
            self._status = self._context.__enter__()
        self._status.update(text)

    def close(self) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)


def _run(args: argparse.Namespace, comm) -> int:
    from dataclasses import asdict

    from .checks import PencilError
    from .solver import eigsh_interval, load_pencil

    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    config = _config(args)
    layout = _layout(args, size)
    a, b = config.a, config.b
    try:
        A, M = load_pencil(args.matrix, args.mass)
        if comm is not None:
            from .parallel import eigsh_interval_mpi

            comm.Barrier()
            start = time.perf_counter()
            try:
                result = eigsh_interval_mpi(A, M, a, b, comm=comm, config=config,
                                            slices=args.slices, mode=layout.mode,
                                            group_size=args.group_size)
            except PencilError:
                raise
            except ValueError as exc:
                # raised on every rank alike, so no rank is left waiting in a collective
                if rank == 0:
                    print(f"furnace eigen solve: {exc}", file=sys.stderr)
                return EXIT_INCOMPLETE
            comm.Barrier()
            seconds = time.perf_counter() - start
            rank_counters = comm.gather(asdict(result.counters))
        else:
            # one rank: every mode is the serial solver; the progress line goes to stderr,
            # so that stdout stays the plain report
            status = _Status()
            start = time.perf_counter()
            try:
                result = eigsh_interval(A, M, a, b, config=config, slices=args.slices or 1,
                                        progress=status)
            finally:
                status.close()
            seconds = time.perf_counter() - start
            rank_counters = [asdict(result.counters)]
    except PencilError as exc:
        raise _pencil_error(exc, args) from None
    if rank != 0:
        return 0 if result.complete else EXIT_INCOMPLETE
    _print_report(result, a, b, size, layout, seconds)
    if args.json:
        atomic_write_text(args.json, json.dumps(_json_report(result, size, layout, seconds,
                                                             rank_counters), indent=2))
    if not result.complete:
        print(f"furnace eigen solve: incomplete: {result.message}", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


def _slice_line(i: int, count: int, s) -> str:
    expected = (f"{int(s.expected)}" if s.count_method == "inertia" else
                f"{s.expected:.1f} +- {s.tolerance:.1f}")
    return (f"  slice {i + 1}/{count} [{s.a:.6g}, {s.b:.6g}]: expected {expected} "
            f"({s.count_method}), found {s.num_found}, "
            f"{'converged' if s.converged else 'NOT converged'}, "
            f"{'complete' if s.complete else 'INCOMPLETE'}"
            + (f", {s.restarts} restart(s)" if s.restarts else ""))


def _print_report(result, a: float, b: float, size: int, layout, seconds: float) -> None:
    state = "" if result.complete else " INCOMPLETE (the count is not vouched for)"
    print(f"{result.eigenvalues.size} eigenvalues in [{a:g}, {b:g}]{state} "
          f"({size} rank{'s' if size > 1 else ''}, mode {layout.mode}, group size "
          f"{layout.group_size}, {len(result.slices)} slice(s), {seconds:.3g} s):")
    for value, res in zip(result.eigenvalues, result.residuals):
        print(f"  {value:.15g}   residual {res:.1e}")
    print(f"slices ({result.count_method}): expected {result.expected:g} in all, found "
          f"{result.eigenvalues.size}")
    for i, s in enumerate(result.slices):
        print(_slice_line(i, len(result.slices), s))
    c = result.counters
    print(f"filter degree {c.filter_degree}, Lanczos steps {c.lanczos_steps}, "
          f"A matvecs {c.a_matvecs}, M matvecs {c.m_matvecs}, halo bytes {c.halo_bytes}, "
          f"allreduces {c.allreduces} (rank 0)")


def _finite(value):
    """NaN (a skipped slice's bar) as JSON null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _json_report(result, size: int, layout, seconds: float, rank_counters) -> dict:
    from dataclasses import asdict

    report = [{key: _finite(value) for key, value in asdict(s).items()} for s in result.slices]
    return {"eigenvalues": result.eigenvalues.tolist(), "residuals": result.residuals.tolist(),
            "complete": result.complete, "message": result.message,
            "expected": _finite(result.expected), "found": int(result.eigenvalues.size),
            "count_method": result.count_method, "ranks": size, "mode": layout.mode,
            "group_size": layout.group_size, "slices": len(result.slices),
            "slice_report": report, "seconds": seconds, "counters": asdict(result.counters),
            "rank_counters": rank_counters}


def main(argv=None) -> int:
    """``furnace eigen ...`` with only this subcommand loaded."""
    parser = Parser(prog="furnace")
    add_parser(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
