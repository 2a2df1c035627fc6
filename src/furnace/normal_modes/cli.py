"""`furnace modes`: normal modes of a planet with the filtered Lanczos solver.

    furnace modes --planet ball --fmin 0.3 --fmax 0.6 --mesh-size 0.15
    furnace modes --planet mars --fmin 0.3 --fmax 0.8 --mesh-size 0.1 [--p2]
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
    modes.add_argument("--slices", type=int, default=1)
    modes.set_defaults(func=_modes)


def _modes(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .solve import compute_modes

    console = Console()
    try:
        with console.status("meshing, assembling, solving ..."):
            res = compute_modes(args.planet, args.fmin, args.fmax, mesh_size=args.mesh_size,
                                order=2 if args.p2 else 1, slices=args.slices)
    except (ValueError, FileNotFoundError) as exc:
        print(f"furnace modes: {exc}", file=sys.stderr)
        return 2
    table = Table(title=f"{args.planet}: {res.frequencies_mhz.size} eigenfrequencies in "
                  f"[{args.fmin:g}, {args.fmax:g}] mHz ({res.unknowns} unknowns, "
                  f"{'P2' if args.p2 else 'P1'})")
    for col in ("multiplet", "f mHz", "members", "complete"):
        table.add_column(col, justify="right")
    for m in res.multiplets:
        table.add_row(f"{m['kind']}{m['l']}", f"{m['frequency']:.5f}", str(m["size"]),
                      "yes" if m["complete"] else "no")
    console.print(table)
    c = res.counters
    console.print(f"filter degree {c.filter_degree}, Lanczos steps {c.lanczos_steps}, "
                  f"A matvecs {c.a_matvecs}; times " + ", ".join(
                      f"{k} {v:.1f} s" for k, v in res.seconds.items()))
    return 0
