"""Running ``furnace eigen solve`` under ``mpiexec``, and a 2-rank MPI link microbenchmark:
the measuring side of the eigensolver's scaling experiments (design note ``eigensolver.md``
section 5.4; `furnace.eigen.scaling_experiments`).

Both run as children of this module's entry point, ``mpiexec -n R python -m
furnace.eigen.mpi_runs eigen solve ...`` and ``mpiexec -n 2 python -m furnace.eigen.mpi_runs
link-benchmark OUT.json``, which loads only the eigen subcommand (the top-level ``furnace``
command imports the shared runtime, seconds of start-up per rank). Every child runs one
BLAS thread per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def find_mpiexec() -> str | None:
    """The venv's mpiexec (the mpich wheel puts it next to python), else one on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of subcommand ``name`` of ``parser`` (argparse exposes no public lookup)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise LookupError(f"{parser.prog} has no subcommands")


def _solve_parser() -> argparse.ArgumentParser:
    from furnace.eigen import cli

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    cli.add_parser(subparsers)
    return _subcommand(subparsers.choices["eigen"], "solve")


def cli_modes() -> tuple[str, ...]:
    """The --mode choices that ``furnace eigen solve`` accepts (empty while it has none)."""
    for action in _solve_parser()._actions:
        if "--mode" in action.option_strings:
            return tuple(m for m in ("rows", "slices", "groups") if m in (action.choices or ()))
    return ()


def cli_options() -> set[str]:
    """The option strings ``furnace eigen solve`` accepts."""
    return {opt for action in _solve_parser()._actions for opt in action.option_strings}


def _single_thread_env() -> dict[str, str]:
    # one core per rank: BLAS threads would make 1 rank use both cores and 2 ranks fight
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    return env


def run_cli(mpiexec: str, ranks: int, a_path: Path, m_path: Path,
            interval: tuple[float, float], *, mode: str, slices: int, json_path: Path,
            modes: tuple[str, ...], timeout: float = 600.0) -> dict:
    """One ``mpiexec -n ranks furnace eigen solve`` run on ``interval``; returns its JSON
    with ``seconds``
    and ``timed_by`` ("solver" when the JSON has the solve's own wall time, else "process",
    the subprocess wall time including start-up and reading the matrices)."""
    # the eigen subcommand through this module's entry point (`main`): the top-level
    # `furnace` command imports the shared runtime (torch), seconds of start-up per rank
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "furnace.eigen.mpi_runs", "eigen",
           "solve", str(a_path), "--mass", str(m_path), "--interval", repr(interval[0]),
           repr(interval[1]), "--lumped", "--json", str(json_path)]
    if ranks > 1 and mode in modes:
        cmd += ["--mode", mode]
    if mode == "slices":
        cmd += ["--slices", str(slices)]
    if "--count-check" in cli_options():
        # the same completeness check as the serial comparisons (experiments.COUNT_CHECK)
        from .comparison import COUNT_CHECK

        cmd += ["--count-check", COUNT_CHECK]
    json_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=_single_thread_env())
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(json_path.read_text())
    if data.get("seconds") is not None:
        data["timed_by"] = "solver"
    else:
        data["seconds"], data["timed_by"] = wall, "process"
    return data


def link_benchmark(comm, sizes=(8, 1024, 8192, 65536, 262144), iterations: int = 300) -> dict:
    """Median seconds of a 2-rank ``Sendrecv`` exchange per message size and of a one-value
    ``Allreduce`` (both ranks send at once, as in a halo exchange)."""
    from mpi4py import MPI

    peer = 1 - comm.Get_rank()
    warm = 10
    exchange = {}
    for size in sizes:
        send = np.ones(max(size // 8, 1))
        recv = np.empty_like(send)
        count = iterations if size <= 65536 else max(iterations // 4, 20)
        times = []
        comm.Barrier()
        for _ in range(count + warm):
            t0 = MPI.Wtime()
            comm.Sendrecv(send, dest=peer, recvbuf=recv, source=peer)
            times.append(MPI.Wtime() - t0)
        exchange[int(send.nbytes)] = statistics.median(times[warm:])
    value, total = np.ones(1), np.empty(1)
    times = []
    comm.Barrier()
    for _ in range(iterations + warm):
        t0 = MPI.Wtime()
        comm.Allreduce(value, total)
        times.append(MPI.Wtime() - t0)
    return {"exchange_seconds": exchange, "allreduce_seconds": statistics.median(times[warm:]),
            "iterations": iterations}


def measure_link(mpiexec: str, out_dir: Path, *, iterations: int = 300) -> dict:
    """Run `link_benchmark` under ``mpiexec -n 2``; adds the fitted alpha and beta."""
    from .costmodel import ScalingModel

    path = out_dir / "link.json"
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "furnace.eigen.mpi_runs", "link-benchmark",
           str(path), "--iterations", str(iterations)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=_single_thread_env())
    if proc.returncode != 0:
        raise RuntimeError(f"link benchmark failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(path.read_text())
    sizes = sorted(int(s) for s in data["exchange_seconds"])
    secs = [data["exchange_seconds"][str(s)] for s in sizes]
    data["alpha"], data["beta"] = ScalingModel.fit_link(sizes, secs)
    return data


def main(argv: list[str] | None = None) -> int:
    """``link-benchmark OUT.json`` (2 ranks), or ``eigen solve ...`` as in the furnace CLI."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m furnace.eigen.mpi_runs")
    sub = parser.add_subparsers(dest="command", required=True)
    from furnace.eigen import cli

    cli.add_parser(sub)
    bench = sub.add_parser("link-benchmark", help="2-rank Sendrecv and Allreduce medians")
    bench.add_argument("out", help="JSON file written by rank 0")
    bench.add_argument("--iterations", type=int, default=300)
    args = parser.parse_args(argv)
    if args.command == "eigen":
        return args.func(args)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        print("link-benchmark needs exactly 2 ranks (mpiexec -n 2)", file=sys.stderr)
        return 2
    result = link_benchmark(comm, iterations=args.iterations)
    if comm.Get_rank() == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
