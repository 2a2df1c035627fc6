"""The `furnace` command: one subcommand per built system, plus reproduce, info and selfcheck.

    furnace info [--calibrate]
    furnace reproduce [SYSTEM ...] [--quick] [--out DIR] [--list]
    furnace selfcheck [--world-size N]
    furnace topology [PRESET]

A system adds its own subcommand by providing ``furnace.<system>.cli.add_parser``;
systems not built yet simply have none.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import __version__
from .runtime.atomic import OutputError
from .runtime.cliargs import Parser, UsageError, int_in, output_dir
from .runtime.reproduce import SYSTEM_NAMES, SYSTEMS
from .runtime.signals import sigterm_exits


def _system_cli_modules():
    for name in SYSTEM_NAMES:
        if name == "runtime":
            continue
        module_name = f"furnace.{name}.cli"
        try:
            yield name, importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name not in (module_name, f"furnace.{name}"):
                raise


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="furnace",
        description="Research systems for large-scale AI training and HPC, as tested software.",
    )
    parser.add_argument("--version", action="version", version=f"furnace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser("info", help="versions, cores, backends and calibrated CPU figures",
                          description="Versions, cores, backends and the calibrated CPU "
                          "figures the this-cpu preset uses, read from the calibration "
                          "cache ~/.cache/furnace/calibration.json.")
    info.add_argument("--calibrate", action="store_true",
                      help="measure this CPU (GEMM, memory, loopback link) and save the figures "
                      "to ~/.cache/furnace/calibration.json, replacing what is there (this is "
                      "how to refresh them)")
    info.set_defaults(func=_cmd_info)

    rep = sub.add_parser("reproduce", help="run the papers' experiments and write a report",
                         description="Run registered experiments and write DIR/report.md, "
                         "DIR/results.json and PNG plots.")
    rep.add_argument("systems", nargs="*", metavar="SYSTEM",
                     help=f"systems to run (default: all): {', '.join(SYSTEM_NAMES)}")
    rep.add_argument("--quick", action="store_true",
                     help="the demo set: each system's quick experiments, minutes in all")
    rep.add_argument("--out", default="results", type=output_dir, help="output directory")
    rep.add_argument("--list", action="store_true", help="list the experiments and exit")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    rep.set_defaults(func=_cmd_reproduce)

    check = sub.add_parser("selfcheck", help="check every collective on N local gloo ranks")
    check.add_argument("--world-size", type=int_in(1, 64), default=2,
                       help="number of local gloo ranks")
    check.set_defaults(func=_cmd_selfcheck)

    topo = sub.add_parser("topology", help="show hardware presets")
    topo.add_argument("preset", nargs="?", help="one preset (default: all but this-cpu)")
    topo.set_defaults(func=_cmd_topology)

    for _, module in _system_cli_modules():
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; a user's mistake returns 2 with one line on stderr, no traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    # the innermost sub-parser's prog, e.g. "furnace moe bench", set by the Parser class
    prog = getattr(args, "_prog", parser.prog)
    try:
        # SIGTERM (a scheduler's kill) unwinds like Ctrl-C: ranks and pools are reaped
        with sigterm_exits():
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OutputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1


def _cmd_info(args: argparse.Namespace) -> int:
    import os
    import platform

    import torch
    import torch.distributed as dist
    from rich.console import Console
    from rich.table import Table

    from .runtime import calibrate

    console = Console()
    table = Table(title=f"furnace {__version__}", show_header=False)
    table.add_row("python", platform.python_version())
    table.add_row("torch", torch.__version__)
    table.add_row("cpu", calibrate.cpu_name())
    table.add_row("cores", str(os.cpu_count()))
    table.add_row("torch threads", str(torch.get_num_threads()))
    table.add_row("cuda", f"{torch.cuda.device_count()} device(s)" if torch.cuda.is_available()
                  else "not available")
    backends = [name for name, ok in (("gloo", dist.is_gloo_available()),
                                      ("nccl", dist.is_nccl_available()),
                                      ("mpi (torch)", dist.is_mpi_available())) if ok]
    table.add_row("torch.distributed", ", ".join(backends) or "none")
    table.add_row("mpi4py", _mpi4py_status())
    built = [name for name in SYSTEM_NAMES if _is_built(name)]
    table.add_row("systems built", ", ".join(built))
    console.print(table)

    cache = calibrate.CalibrationCache.default()
    record = cache.load()
    if args.calibrate:
        with console.status("calibrating: GEMM, memory copy, gloo loopback ..."):
            record = calibrate.measure()
        path = cache.save(record)
        console.print(f"saved to {path}")
    if record is None:
        console.print(f"CPU not calibrated yet (no {cache.describe()}): "
                      "run `furnace info --calibrate`.")
        return 0
    console.print(f"calibration cache: {cache.describe()} "
                  "(refresh: `furnace info --calibrate`)")
    cal = Table(title=f"calibrated CPU figures (measured {record['date']})")
    cal.add_column("figure")
    cal.add_column("value", justify="right")
    for dtype, flops in record["matmul_flops_per_thread"].items():
        cal.add_row(f"GEMM {dtype}, 1 thread", f"{flops / 1e9:.1f} GFLOP/s")
    cal.add_row(f"GEMM float32, {record['torch_threads']} threads",
                f"{record['matmul_flops_all_threads_float32'] / 1e9:.1f} GFLOP/s")
    cal.add_row("memory copy", f"{record['memory_bandwidth_Bps'] / 1e9:.1f} GB/s")
    if record.get("loopback"):
        cal.add_row("gloo loopback latency", f"{record['loopback']['latency_s'] * 1e6:.0f} us")
        cal.add_row("gloo loopback bandwidth",
                    f"{record['loopback']['bandwidth_Bps'] / 1e9:.2f} GB/s")
    console.print(cal)
    return 0


def _mpi4py_status() -> str:
    try:
        from mpi4py import MPI
    except ImportError:
        return "not installed (pip install 'furnace[hpc]')"
    except Exception as exc:
        return f"installed but unusable: {exc}"
    return f"{MPI.Get_library_version().splitlines()[0].strip()}"


def _is_built(system: str) -> bool:
    return importlib.util.find_spec(f"furnace.{system}") is not None


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .runtime import reproduce

    unknown = [s for s in args.systems if s not in SYSTEM_NAMES]
    if unknown:
        raise UsageError("SYSTEM", f"unknown system(s) {', '.join(unknown)}; "
                         f"known: {', '.join(SYSTEM_NAMES)}")
    console = Console()
    if args.list:
        experiments, missing = reproduce.select(args.systems, quick=args.quick)
        for exp in experiments:
            console.print(f"{exp.system}/{exp.name}{'' if exp.quick else ' (full set only)'}: "
                          f"{exp.title}")
        for system in missing:
            console.print(f"{system}: {reproduce.missing_reason(system)}")
        return 0
    write_error = None
    try:
        outcomes = reproduce.run(args.systems, quick=args.quick, out_dir=args.out,
                                 show_progress=not args.no_progress)
    except OutputError as exc:
        if not hasattr(exc, "outcomes"):
            raise
        write_error, outcomes = exc, exc.outcomes
    failed = [o for o in outcomes if o.error is not None]
    titles = dict(SYSTEMS)
    for o in outcomes:
        status = "[red]FAILED[/red]" if o.error else "[green]ok[/green]"
        console.print(f"{status} {o.experiment.system}/{o.experiment.name} ({o.seconds:.1f} s)")
        if o.result is not None:
            for c in o.result.claims:
                mark = "" if c.holds is None else (" [green]meets[/green]" if c.holds
                                                   else " [red]misses[/red]")
                console.print(f"    {c.what}: {c.ours} [{c.kind}]{mark} (target: {c.paper})")
    for o in failed:
        console.print(f"[red]{o.experiment.system}/{o.experiment.name} failed:[/red]\n{o.error}")
    _, missing = reproduce.select(args.systems, quick=args.quick)
    for system in missing:
        console.print(f"skipped {system} ({titles[system]}): "
                      f"{reproduce.missing_reason(system)}")
    if write_error is not None:
        print(f"furnace reproduce: error: {write_error}; the previous report in {args.out} "
              "is kept, this run's results are printed above", file=sys.stderr)
        return 1
    console.print(f"report: {args.out}/report.md")
    return 1 if failed else 0


def _cmd_selfcheck(args: argparse.Namespace) -> int:
    from .runtime.launch import run_distributed
    from .runtime.selfcheck import _rank_main

    failures = run_distributed(_rank_main, args.world_size, timeout_s=120)
    flat = [f for part in failures for f in part]
    print("\n".join(flat) if flat else f"selfcheck: ok ({args.world_size} gloo ranks, every op "
          "equal to its expected value and byte model)")
    return 1 if flat else 0


def _cmd_topology(args: argparse.Namespace) -> int:
    from .runtime.presets import PRESETS, get_preset

    names = [args.preset] if args.preset else [n for n in PRESETS if n != "this-cpu"]
    try:
        for name in names:
            print(get_preset(name).describe())
    except ValueError as exc:
        raise UsageError("PRESET", str(exc)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
