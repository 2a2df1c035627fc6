"""`furnace modes`: normal modes of a planet with the filtered Lanczos solver.

The command-line driver of this package's NormalModes pipeline (Shi, Li, Xi, Saad, de Hoop,
SC'18: mesh, assemble, pEVSL's filtered Lanczos, identify; the parallel modes of section
IV.D through `furnace.eigen.eigsh_interval_mpi`):

    furnace modes --planet ball --fmin-mhz 0.3 --fmax-mhz 0.6 --mesh-size 0.15
    furnace modes --planet mars --fmin 0.3 --fmax 0.8 --mesh-size 0.1 [--p2]
    furnace modes --planet ball --fmin 0.3 --fmax 0.6 --plot maps/ --vtu modes.vtu

    mpiexec -n 2 furnace modes --planet mars --fmin 0.3 --fmax 1.0 --mesh-size 0.1 --slices 2

The options that set `ModesConfig` fields are declared from its fields (flag = field name,
``--fmin``/``--fmax`` being the short spellings of ``--fmin-mhz``/``--fmax-mhz``).

Every user mistake (a bad number, fmin >= fmax, a combination the package does not have,
a missing planet model file, an output that cannot be written) is found before meshing and
ends with exit status 2 and one line naming the argument (`furnace.runtime.cliargs`). Under
mpiexec every rank meshes and assembles the same problem and the solver runs in the chosen
parallel mode (--mode slices|rows|groups); rank 0 prints and writes the files, each one
atomically (`furnace.runtime.atomic`). --plot writes one PNG per multiplet (its lowest
member: surface map and meridional section, furnace.normal_modes.plots); --vtu writes every
mode as point data for ParaView.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from furnace.runtime.cliargs import (
    UsageError,
    add_config_arguments,
    float_in,
    output_dir,
    output_file,
    positive_int,
    require,
)

from .config import ModesConfig

# finest mesh accepted: the unit ball has 82,863 P1 unknowns at h = 0.05 and the count
# grows like h^-3, so h = 0.01 R is about 10 million unknowns (the gmsh mesh and the
# eigenvectors alone then need tens of GB)
MIN_MESH_SIZE = 0.01
PARALLEL_MODES = ("slices", "rows", "groups")


def add_parser(subparsers) -> None:
    modes = subparsers.add_parser(
        "modes", help="planetary normal modes (filtered Lanczos)",
        description="Normal modes of a planet with f in [--fmin, --fmax] mHz: gmsh mesh, "
        "P1/P2 elasticity, polynomial-filtered Lanczos, multiplet identification.",
        epilog="exit status: 0 done; 1 the solver cannot vouch for the number of modes in "
        "the band, or an output could not be written; 2 a mistake in the arguments (one line "
        "on stderr, before any meshing).")
    # the options that set ModesConfig fields come from its fields; the band keeps its old
    # spelling (--fmin, --fmax) beside the field's, which the documentation uses throughout
    add_config_arguments(modes, ModesConfig, ["planet", "fmin_mhz", "fmax_mhz", "mesh_size"],
                         overrides={
                             "fmin_mhz": {"flags": ("--fmin-mhz", "--fmin"), "metavar": "MHZ",
                                          "type": float_in(0.0, lo_open=True)},
                             "fmax_mhz": {"flags": ("--fmax-mhz", "--fmax"), "metavar": "MHZ",
                                          "type": float_in(0.0, lo_open=True)},
                             "mesh_size": {"type": float_in(MIN_MESH_SIZE, 1.0)}})
    modes.add_argument("--p2", action="store_true", help="P2 elements (consistent mass)")
    add_config_arguments(modes, ModesConfig, ["slices", "fluid"], overrides={
        "slices": {"type": positive_int, "default": None,
                   "help": "spectrum slices (default: 1, or the number of MPI ranks)"}})
    modes.add_argument("--mode", choices=PARALLEL_MODES, default="slices",
                       help="parallel mode under mpiexec")
    modes.add_argument("--group-size", type=positive_int, default=None,
                       help="ranks per slice, with --mode groups (must divide the ranks)")
    modes.add_argument("--plot", metavar="DIR", type=output_dir, default=None,
                       help="write one PNG per multiplet (surface map + meridional section)")
    modes.add_argument("--vtu", metavar="FILE", type=output_file, default=None,
                       help="write all modes to a VTU for ParaView")
    modes.add_argument("--json", metavar="FILE", type=output_file, default=None,
                       help="write frequencies, multiplets, counters and times here")
    modes.set_defaults(func=_modes)


def check_args(args: argparse.Namespace, ranks: int | None = None) -> None:
    """Every check that spans several arguments, the planet's model file, and the output
    folders; raises `UsageError` before any meshing. ``ranks``: the MPI world size, to
    check --group-size against (None: not yet known, checked by `check_layout`)."""
    from furnace.runtime.atomic import OutputError, check_writable_dir

    from .models import load_planet

    require(args.fmin_mhz < args.fmax_mhz, "--fmax-mhz",
            f"must be greater than --fmin-mhz, got --fmin-mhz {args.fmin_mhz:g} --fmax-mhz "
            f"{args.fmax_mhz:g}")
    try:
        model = load_planet(args.planet)
    except (OSError, ValueError) as exc:
        raise UsageError("--planet", f"cannot load the {args.planet} model: {exc}") from None
    if args.fluid is not None:
        require(model.fluid_core_radius > 0, "--fluid",
                f"planet {args.planet} has no fluid core; leave --fluid out")
        require(not (args.p2 and args.fluid == "split"), "--fluid",
                "the split-node form exists for P1 only; with --p2 use --fluid welded")
    if args.mode == "groups":
        require(args.group_size is not None, "--group-size", "is required with --mode groups")
    else:
        require(args.group_size is None, "--group-size",
                f"is only for --mode groups, got --mode {args.mode}")
    if ranks is not None:
        check_layout(args, ranks)
    outputs: dict[Path, str] = {}
    for flag in ("--json", "--vtu"):
        path = getattr(args, flag[2:])
        if path is not None:
            resolved = Path(path).resolve()
            require(resolved not in outputs, flag,
                    f"names the same file as {outputs.get(resolved)}: {path}")
            outputs[resolved] = flag
    if args.plot is not None:
        require(Path(args.plot).resolve() not in outputs, "--plot",
                f"names the same path as {outputs.get(Path(args.plot).resolve())}")
        try:
            check_writable_dir(args.plot, create=True)
        except OutputError as exc:
            raise UsageError("--plot", str(exc)) from None


def check_layout(args: argparse.Namespace, ranks: int) -> None:
    """--group-size against the number of MPI ranks."""
    if args.mode == "groups":
        require(ranks % args.group_size == 0, "--group-size",
                f"must divide the {ranks} MPI rank(s), got {args.group_size}")


def _modes(args: argparse.Namespace) -> int:
    # everything but the rank count first: starting MPI is the slowest part of the checks
    check_args(args)
    comm = _mpi_world()
    rank = 0 if comm is None else comm.Get_rank()
    ranks = 1 if comm is None else comm.Get_size()
    check_layout(args, ranks)

    from rich.console import Console
    from rich.table import Table

    from furnace.eigen import IncompleteError

    from .solve import compute_modes

    slices = args.slices or ranks
    console = Console(quiet=rank != 0)
    try:
        with console.status("starting ...") as status:
            res = compute_modes(args.planet, args.fmin_mhz, args.fmax_mhz,
                                mesh_size=args.mesh_size, order=2 if args.p2 else 1,
                                slices=slices, fluid=args.fluid, comm=comm, mode=args.mode,
                                group_size=args.group_size,
                                progress=lambda text: status.update(text + " ..."))
    except IncompleteError as exc:
        # the solver cannot vouch for the number of modes: no partial answer as a whole one
        if rank == 0:
            print(f"furnace modes: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        if rank == 0:
            print(f"furnace modes: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    if rank != 0:
        return 0
    table = Table(title=f"{args.planet}: {res.frequencies_mhz.size} eigenfrequencies in "
                  f"[{args.fmin_mhz:g}, {args.fmax_mhz:g}] mHz ({res.unknowns} unknowns, "
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
        write_json(res, args.json, ranks=ranks, mode=args.mode)
    if args.plot:
        paths = write_plots(res, args.plot)
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


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def write_json(res, path, *, ranks: int, mode: str) -> Path:
    """Frequencies, multiplets, counters and times of `res`, written atomically."""
    import json
    from dataclasses import asdict

    from furnace.runtime.atomic import atomic_write_text

    return atomic_write_text(path, json.dumps({
        "planet": res.planet, "unknowns": res.unknowns, "ranks": ranks, "mode": mode,
        "frequencies_mhz": res.frequencies_mhz.tolist(),
        "multiplets": [{"kind": m["kind"], "l": m["l"], "size": m["size"],
                        "frequency_mhz": m["frequency"], "complete": m["complete"],
                        "members": [int(j) for j in m["members"]]}
                       for m in res.multiplets],
        "counters": asdict(res.counters), "seconds": res.seconds,
    }, indent=2))


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def write_plots(res, out_dir) -> list[Path]:
    """One PNG per named multiplet (its lowest member), each written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from furnace.runtime.atomic import atomic_save, check_writable_dir

    from .models import load_planet
    from .plots import mode_figure

    out = check_writable_dir(out_dir, create=True)
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
        try:
            atomic_save(path, partial(fig.savefig, format="png", dpi=110))
        finally:
            plt.close(fig)
        paths.append(path)
    return paths
