"""The `furnace reproduce` registry and report writer.

Each system lists its experiments in its own ``experiments.py`` as ``EXPERIMENTS``, a
list of `Experiment`. An experiment is a function of a `RunContext` that returns a
`Result`: tables, PNG figures, and claims that put the paper's figure next to ours, each
labelled by how our number was obtained (measured, emulated, virtual-clock, simulated,
analytic). `run` executes a selection with a progress bar and writes ``report.md``,
``results.json`` and the figures into one directory. Systems whose subpackage does not
exist yet are skipped and listed as such in the report.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import math
import platform
import time
import traceback
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from .atomic import OutputError, atomic_save, atomic_write_many, check_writable_dir

Kind = Literal["measured", "emulated", "virtual-clock", "simulated", "analytic"]
T = TypeVar("T")
KINDS: tuple[str, ...] = ("measured", "emulated", "virtual-clock", "simulated", "analytic")

# (subpackage, what it implements), in report order
SYSTEMS: tuple[tuple[str, str], ...] = (
    ("runtime", "Shared runtime: launcher, instrumented collectives, network emulator"),
    ("moe", "FasterMoE: expert-parallel MoE (PPoPP'22)"),
    ("hybrid", "BaGuaLu: hybrid-parallel MoE training on supercomputers (PPoPP'22)"),
    ("context_parallel", "UltraAttn: context parallelism for block-sparse attention (SC'25)"),
    ("recsys", "Pattern-aware sparse communication for recommendation models (PPoPP'24)"),
    ("decentralized", "Prague: heterogeneity-aware decentralized training (ASPLOS'20)"),
    ("emulation", "Ape: emulated data types on accelerators (ICS'22)"),
    ("deltaformer", "DeltaFormer (NeurIPS'25)"),
    ("eigen", "Polynomial-filtered Lanczos eigensolver (SC'18, SC'19 reproduction)"),
    ("normal_modes", "Planetary normal modes (SC'18, SC'19 reproduction)"),
)
SYSTEM_NAMES = tuple(name for name, _ in SYSTEMS)


@dataclass
class Table:
    """A result table; ``kind`` labels where its numbers come from.

    ``kind`` has no default: a table whose author forgot to say how its numbers were
    obtained must fail to construct, not read as measured.
    """

    title: str
    columns: list[str]
    rows: list[list[Any]]
    kind: Kind
    note: str = ""

    def __post_init__(self) -> None:
        _check_kind(self.kind, f"table {self.title!r}")
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"table {self.title!r}: row {row} has {len(row)} cells, "
                                 f"expected {len(self.columns)}")

    def to_markdown(self) -> str:
        head = f"**{self.title}** ({self.kind})"
        lines = [head, "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in self.rows]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)


@dataclass
class Claim:
    """A paper's figure next to ours. ``holds`` says whether our figure meets the target."""

    what: str
    paper: str
    ours: str
    kind: Kind
    source: str = ""
    holds: bool | None = None

    def __post_init__(self) -> None:
        _check_kind(self.kind, f"claim {self.what!r}")


@dataclass
class Result:
    tables: list[Table] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunContext:
    """What an experiment gets: where to write, how big to run, how to report progress.

    ``artifacts`` is the one place experiments of a run share expensive work (a trained
    model, a set of solver runs): `shared` builds a value once per run under an explicit
    key. A builder must be a pure function of its key (seeded, forking the RNG), so an
    experiment run alone computes exactly what it would receive from the cache.
    """

    out_dir: Path
    quick: bool
    progress: Callable[[str], None] = lambda text: None
    artifacts: dict[Hashable, Any] = field(default_factory=dict)

    def shared(self, key: Hashable, build: Callable[[], T]) -> T:
        """The value cached under ``key`` in this run, built by ``build()`` on first use."""
        if key not in self.artifacts:
            self.artifacts[key] = build()
        return cast(T, self.artifacts[key])

    def save_figure(self, fig: Any, name: str) -> str:
        """Save a matplotlib figure as ``name``.png; returns its path relative to the report."""
        import matplotlib.pyplot as plt

        path = self.out_dir / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            atomic_save(path, lambda f: fig.savefig(f, format="png", dpi=120,
                                                    bbox_inches="tight"))
        finally:
            plt.close(fig)
        return path.relative_to(self.out_dir).as_posix()


@dataclass(frozen=True)
class Experiment:
    """One reproduction: ``fn(ctx) -> Result``. ``quick`` puts it in the demo set."""

    system: str
    name: str
    title: str
    fn: Callable[[RunContext], Result]
    quick: bool = True


@dataclass
class Outcome:
    experiment: Experiment
    seconds: float
    result: Result | None
    error: str | None = None


def _check_kind(kind: str, what: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"{what}: kind must be one of {KINDS}, got {kind!r}")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def discover(system: str) -> list[Experiment] | None:
    """The system's experiments, or None when its subpackage is not built yet."""
    if system not in SYSTEM_NAMES:
        raise ValueError(f"unknown system {system!r}; known: {', '.join(SYSTEM_NAMES)}")
    module_name = f"furnace.{system}.experiments"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (module_name, f"furnace.{system}"):
            return None
        raise
    experiments = list(getattr(module, "EXPERIMENTS", []))
    for exp in experiments:
        if exp.system != system:
            raise ValueError(f"{module_name} registers {exp.name!r} under {exp.system!r}")
    return experiments


def missing_reason(system: str) -> str:
    """Why a system has no experiments: not built at all, or built without experiments yet."""
    if importlib.util.find_spec(f"furnace.{system}") is None:
        return "not built yet"
    try:
        module = importlib.import_module(f"furnace.{system}.experiments")
    except ModuleNotFoundError:
        return "no experiments registered yet"
    owner = getattr(module, "REPORTED_UNDER", None)
    return f"its experiments are reported under {owner}" if owner else \
        "no experiments registered yet"


def select(systems: Sequence[str], quick: bool) -> tuple[list[Experiment], list[str]]:
    """Experiments to run and the systems that are not built yet."""
    chosen: list[Experiment] = []
    missing: list[str] = []
    for system in systems or SYSTEM_NAMES:
        found = discover(system)
        if not found:  # not built, or built with nothing registered under its own name
            missing.append(system)
            continue
        chosen.extend(e for e in found if e.quick or not quick)
    return chosen, missing


def run(
    systems: Sequence[str] = (),
    *,
    quick: bool = False,
    out_dir: Path | str = "results",
    show_progress: bool = True,
    experiments: Sequence[Experiment] | None = None,
) -> list[Outcome]:
    """Run the selected experiments and write the report; returns each outcome.

    ``experiments`` replaces discovery (for tests and scripts); ``systems`` then only
    orders the report. The output folder is checked writable before the first experiment.
    ``report.md`` and ``results.json`` are replaced together or not at all: if writing them
    fails (a full disk), the previous pair is kept and an `OutputError` is raised whose
    ``outcomes`` attribute holds this run's results.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # before any experiment: an unwritable folder must not cost a whole run
    out = check_writable_dir(out_dir)
    if experiments is None:
        experiments, missing = select(systems, quick)
    else:
        experiments, missing = list(experiments), []
    outcomes: list[Outcome] = []
    # shared by every experiment of this run, and by no other run
    artifacts: dict[Hashable, Any] = {}
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total}"), TimeElapsedColumn(), TextColumn("{task.fields[detail]}"))
    with Progress(*columns, disable=not show_progress) as progress:
        bar = progress.add_task("reproduce", total=len(experiments), detail="")
        for exp in experiments:
            label = f"{exp.system}/{exp.name}"
            progress.update(bar, description=label, detail="")
            ctx = RunContext(out_dir=out, quick=quick,
                             progress=lambda text: progress.update(bar, detail=text),
                             artifacts=artifacts)
            t0 = time.perf_counter()
            try:
                result = exp.fn(ctx)
                outcomes.append(Outcome(exp, time.perf_counter() - t0, result))
            except Exception:
                outcomes.append(Outcome(exp, time.perf_counter() - t0, None,
                                        traceback.format_exc()))
            progress.advance(bar)
    total = time.perf_counter() - started
    try:
        write_report(outcomes, missing, out, quick=quick, total_s=total,
                     systems=list(systems) or _ordered_systems(experiments))
    except OutputError as exc:
        # the previous report and results are intact; the caller still gets the new ones
        exc.outcomes = outcomes
        raise
    return outcomes


def _ordered_systems(experiments: Sequence[Experiment]) -> list[str]:
    known = [name for name in SYSTEM_NAMES if any(e.system == name for e in experiments)]
    return known + sorted({e.system for e in experiments} - set(known))


def _environment() -> dict[str, Any]:
    import os

    import torch

    from .. import __version__
    from .calibrate import cpu_name

    return {
        "furnace": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_report(
    outcomes: Iterable[Outcome],
    missing: Sequence[str],
    out: Path,
    *,
    quick: bool,
    total_s: float,
    systems: Sequence[str],
) -> tuple[Path, Path]:
    outcomes = list(outcomes)
    env = _environment()
    titles = dict(SYSTEMS)
    md = [
        "# Furnace reproduction report",
        "",
        f"Set: {'quick (demo)' if quick else 'full'}; total {total_s:.1f} s; "
        f"furnace {env['furnace']}, torch {env['torch']}, Python {env['python']}; "
        f"{env['cpu']}, {env['cores']} cores; {env['date']}.",
        "",
        "Labels: *measured* = wall clock on this machine; *emulated* = wall clock with "
        "links slowed by the network emulator; *virtual-clock* = deterministic modelled "
        "time; *simulated* = discrete-event simulator; *analytic* = closed-form model.",
        "",
        "| system | experiment | status | time (s) |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        status = "ok" if o.error is None else "FAILED"
        md.append(f"| {o.experiment.system} | {o.experiment.name} | {status} | {o.seconds:.1f} |")
    for system in missing:
        md.append(f"| {system} | - | {missing_reason(system)} | - |")
    for system in systems:
        mine = [o for o in outcomes if o.experiment.system == system]
        if not mine:
            continue
        md += ["", f"## {system}: {titles.get(system, '')}"]
        for o in mine:
            md += ["", f"### {o.experiment.title}", "",
                   f"`furnace reproduce {system}{' --quick' if quick else ''}`; "
                   f"took {o.seconds:.1f} s."]
            if o.error is not None:
                md += ["", "**Failed:**", "", "```", o.error.strip(), "```"]
                continue
            res = o.result
            assert res is not None
            if res.claims:
                md += ["", "| claim | paper | ours | kind | meets target | source |",
                       "|---|---|---|---|---|---|"]
                for c in res.claims:
                    holds = "" if c.holds is None else ("yes" if c.holds else "NO")
                    cells = [c.what, c.paper, c.ours, c.kind, holds, c.source]
                    md.append("| " + " | ".join(_cell(x) for x in cells) + " |")
            for table in res.tables:
                md += ["", table.to_markdown()]
            for fig in res.figures:
                md += ["", f"![{Path(fig).stem}]({fig})"]
            for note in res.notes:
                md += ["", note]
    if missing:
        md += ["", "## Skipped", ""]
        md += [f"- `{s}` ({missing_reason(s)}): {titles.get(s, '')}" for s in missing]
    report = out / "report.md"
    payload = {
        "environment": env,
        "quick": quick,
        "total_s": total_s,
        "not_built": list(missing),
        "experiments": [
            {
                "system": o.experiment.system,
                "name": o.experiment.name,
                "title": o.experiment.title,
                "seconds": o.seconds,
                "error": o.error,
                "result": asdict(o.result) if o.result is not None else None,
            }
            for o in outcomes
        ],
    }
    results = out / "results.json"
    # both or neither: a report saying "ok" must never sit beside truncated results
    atomic_write_many({results: json.dumps(payload, indent=2, default=str),
                       report: "\n".join(md) + "\n"})
    return report, results
