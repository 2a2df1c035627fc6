"""`furnace modes`: normal modes of a planet with the filtered Lanczos solver.

    furnace modes --planet ball --fmin 0.3 --fmax 0.6 --mesh-size 0.15
    furnace modes --planet mars --fmin 0.3 --fmax 0.8 --mesh-size 0.1 [--p2]
    furnace modes --planet ball --fmin 0.3 --fmax 0.6 --plot maps/ --vtu modes.vtu

    mpiexec -n 2 furnace modes --planet mars --fmin 0.3 --fmax 1.0 --mesh-size 0.1 --slices 2

Under mpiexec every rank meshes and assembles the same problem and the solver runs in the
chosen parallel mode (--mode slices|rows|groups); rank 0 prints and writes the files.
--plot writes one PNG per multiplet (its lowest member: surface map and meridional
section, furnace.normal_modes.plots); --vtu writes every mode as point data for ParaView.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    modes = subparsers.add_parser("modes", help="planetary normal modes (filtered Lanczos)")
    modes.add_argument("--planet", choices=("ball", "mars", "prem", "moon"), default="ball")
    modes.add_argument("--fmin", type=float, required=True, help="mHz, above 0")
    modes.add_argument("--fmax", type=float, required=True, help="mHz")
    modes.add_argument("--mesh-size", type=float, default=0.15,
                       help="target edge length relative to the radius")
    modes.add_argument("--p2", action="store_true", help="P2 elements (consistent mass)")
    modes.add_argument("--slices", type=int, default=None,
                       help="spectrum slices (default: 1, or the number of MPI ranks)")
    modes.add_argument("--fluid", choices=("split", "welded"), default=None,
                       help="fluid-core form (default: split for P1, welded for P2)")
    modes.add_argument("--mode", choices=("slices", "rows", "groups"), default="slices",
                       help="parallel mode under mpiexec")
    modes.add_argument("--group-size", type=int, default=None,
                       help="ranks per slice in --mode groups")
    modes.add_argument("--plot", metavar="DIR",
                       help="write one PNG per multiplet (surface map + meridional section)")
    modes.add_argument("--vtu", metavar="FILE", help="write all modes to a VTU for ParaView")
    modes.add_argument("--json", metavar="FILE",
                       help="write frequencies, multiplets, counters and times here")
    modes.set_defaults(func=_modes)


def _modes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .solve import compute_modes

    comm = _mpi_world()
    rank = 0 if comm is None else comm.Get_rank()
    slices = args.slices or (1 if comm is None else comm.Get_size())
    console = Console(quiet=rank != 0)
    try:
        with console.status("starting ...") as status:
            res = compute_modes(args.planet, args.fmin, args.fmax, mesh_size=args.mesh_size,
                                order=2 if args.p2 else 1, slices=slices, fluid=args.fluid,
                                comm=comm, mode=args.mode, group_size=args.group_size,
                                progress=lambda text: status.update(text + " ..."))
    except (ValueError, FileNotFoundError) as exc:
        print(f"furnace modes: {exc}", file=sys.stderr)
        return 2
    if rank != 0:
        return 0
    table = Table(title=f"{args.planet}: {res.frequencies_mhz.size} eigenfrequencies in "
                  f"[{args.fmin:g}, {args.fmax:g}] mHz ({res.unknowns} unknowns, "
                  f"{'P2' if args.p2 else 'P1'})")
    for col in ("multiplet", "f mHz", "members", "complete"):
        table.add_column(col, justify="right")
    for m in res.multiplets:
        name = "core" if m["kind"] == "C" else f"{m['kind']}{m['l']}"
        table.add_row(name, f"{m['frequency']:.5f}", str(m["size"]),
                      "yes" if m["complete"] else ("-" if m["kind"] == "C" else "no"))
    console.print(table)
    c = res.counters
    console.print(f"filter degree {c.filter_degree}, Lanczos steps {c.lanczos_steps}, "
                  f"A matvecs {c.a_matvecs}; times " + ", ".join(
                      f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    if args.json:
        _write_json(res, args, comm)
    if args.plot:
        paths = _write_plots(res, args.plot)
        console.print(f"wrote {len(paths)} mode figures to {args.plot}")
    if args.vtu:
        from .export import write_vtu

        labels = [""] * res.frequencies_mhz.size
        for m in res.multiplets:
            for j in m["members"]:
                labels[j] = f"{m['kind']}{m['l']}"
        path = write_vtu(args.vtu, res.mesh, res.basis, res.eigenvectors, res.frequencies_mhz,
                         labels=labels)
        console.print(f"wrote {res.frequencies_mhz.size} modes to {path}")
    return 0


def _write_json(res, args, comm) -> None:
    import json
    from dataclasses import asdict

    with open(args.json, "w") as f:
        json.dump({
            "planet": res.planet, "unknowns": res.unknowns,
            "ranks": 1 if comm is None else comm.Get_size(), "mode": args.mode,
            "frequencies_mhz": res.frequencies_mhz.tolist(),
            "multiplets": [{"kind": m["kind"], "l": m["l"], "size": m["size"],
                            "frequency_mhz": m["frequency"], "complete": m["complete"],
                            "members": [int(j) for j in m["members"]]}
                           for m in res.multiplets],
            "counters": asdict(res.counters), "seconds": res.seconds,
        }, f, indent=2)


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _write_plots(res, out_dir) -> list:
    from pathlib import Path

    from .models import load_planet
    from .plots import mode_figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fluid = load_planet(res.planet).fluid_core_radius or None
    paths = []
    for i, m in enumerate(res.multiplets):
        if m["kind"] == "C":  # core-dominated: no surface expression to map
            continue
        j = int(m["members"][0])
        label = f"{m['kind']}{m['l']}"
        f = float(res.frequencies_mhz[j])
        # identification fits the curl family, which separates T from S more reliably than
        # the radial share that kind="auto" looks at
        fig = mode_figure(res.mesh, res.basis, res.eigenvectors[:, j],
                          label=f"{res.planet} {label} (mode {j})", frequency_mhz=f,
                          fluid_radius=fluid,
                          kind="tangential" if m["kind"] == "T" else "radial")
        path = out / f"{res.planet}_{i:02d}_{label}_{f:.4f}mHz.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths
