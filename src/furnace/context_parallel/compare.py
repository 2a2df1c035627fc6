"""Every context-parallel scheme side by side on one mask: the traffic table of UltraAttn
(Yang et al., SC'25) §6 with the design note's §6.4 units, and pictures of a plan's tiling.

`compare_schemes` runs the planner (`context_tiling.plan_attention`, which prices every
baseline and the 2-D tiling under each layout and keeps the cheapest) and adds Ulysses'
closed-form figures where Ulysses applies. All figures are counts (bytes, messages,
elements), so they do not depend on the machine; only ``estimate_s`` is modelled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .baselines import ulysses_stats
from .context_tiling import TilingConfig, plan_attention
from .masks import EMPTY, BlockGrid
from .plan import AttentionShape, Plan, block_units

if TYPE_CHECKING:
    from rich.table import Table as RichTable

    from furnace.runtime.topology import Topology

__all__ = ["SchemeComparison", "SchemeRow", "compare_schemes", "plot_tiling", "scheme_table",
           "tiling_picture"]

TILED_PREFIX = "tiled"


@dataclass(frozen=True)
class SchemeRow:
    """One scheme's figures on the busiest rank (bytes: forward plus backward)."""

    scheme: str
    layout: str
    staging: str
    max_forward_inbound: int
    max_inbound: int
    max_port: int
    total_bytes: int
    balance: float
    max_messages: int
    num_collectives: int
    unused_bytes: int
    estimate_s: float | None
    chosen: bool = False
    note: str = ""

    @property
    def tiled(self) -> bool:
        return self.scheme.startswith(TILED_PREFIX)


@dataclass(frozen=True)
class SchemeComparison:
    """The planner's choice and every candidate it priced, plus Ulysses."""

    grid: BlockGrid
    num_ranks: int
    shape: AttentionShape
    chosen: Plan
    rows: tuple[SchemeRow, ...]
    unit_bytes: int

    def row(self, scheme: str) -> SchemeRow:
        """The cheapest candidate of ``scheme`` ("tiled" means any tiled scheme)."""
        found = [r for r in self.rows if r.scheme == scheme
                 or (scheme == TILED_PREFIX and r.tiled)]
        if not found:
            raise KeyError(f"no {scheme!r} among {sorted({r.scheme for r in self.rows})}")
        return min(found, key=lambda r: (r.estimate_s is None, r.estimate_s or 0.0,
                                         r.max_port))

    @property
    def has_tiled(self) -> bool:
        return any(r.tiled for r in self.rows)

    def ratio_to_ring(self, scheme: str, figure: str = "max_inbound") -> float:
        ring = getattr(self.row("ring"), figure)
        ours = getattr(self.row(scheme), figure)
        return float(ours) / float(ring) if ring else float("inf") if ours else 1.0

    def best_baseline(self) -> SchemeRow:
        rows = [r for r in self.rows if not r.tiled and r.estimate_s is not None]
        return min(rows, key=lambda r: (r.estimate_s or 0.0, r.max_port))

    def summary(self) -> str:
        chosen = next(r for r in self.rows if r.chosen)
        text = (f"kept: {chosen.scheme} ({chosen.layout}, {chosen.staging} staging); "
                f"{self.chosen.info.get('reason', '')}")
        if self.has_tiled:
            tiled = self.row(TILED_PREFIX)
            text += (f"\n2-D tiling vs ring, busiest rank inbound: forward "
                     f"{self.ratio_to_ring(tiled.scheme, 'max_forward_inbound'):.3f}, "
                     f"forward+backward {self.ratio_to_ring(tiled.scheme):.3f}; "
                     f"balance {tiled.balance:.3f}")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"seq_len": self.grid.seq_len, "num_blocks": self.grid.num_blocks,
                "num_ranks": self.num_ranks, "shape": dataclasses.asdict(self.shape),
                "unit_bytes": self.unit_bytes, "chosen": self.chosen.scheme,
                "chosen_layout": self.chosen.layout.kind,
                "chosen_staging": str(self.chosen.info.get("staging", "distance")),
                "reason": str(self.chosen.info.get("reason", "")),
                "rows": [dataclasses.asdict(r) for r in self.rows]}


def _row_from_candidate(row: Mapping[str, Any], chosen: Plan) -> SchemeRow:
    note = ""
    if "status" in row:
        note = f"{row.get('method', '')} {row['status']} in {float(row['solve_s']):.2f} s"
    return SchemeRow(
        scheme=str(row["scheme"]), layout=str(row["layout"]),
        staging=str(row.get("staging", "distance")),
        max_forward_inbound=int(row["max_forward_inbound"]),
        max_inbound=int(row["max_inbound"]), max_port=int(row["max_port"]),
        total_bytes=int(row["total_bytes"]), balance=float(row["balance"]),
        max_messages=int(row["max_messages"]), num_collectives=int(row["num_collectives"]),
        unused_bytes=int(row["unused_bytes"]), estimate_s=float(row["estimate_s"]),
        chosen=(row["scheme"] == chosen.scheme and row["layout"] == chosen.layout.kind
                and row.get("staging", "distance") == chosen.info.get("staging", "distance")),
        note=note.strip())


def compare_schemes(grid: BlockGrid, num_ranks: int, shape: AttentionShape, *,
                    config: TilingConfig | None = None, granularity: str = "block",
                    ranks_per_node: int | None = None,
                    topology: Topology | None = None) -> SchemeComparison:
    """Plan ``grid`` on ``num_ranks`` ranks and tabulate every candidate (see module doc)."""
    chosen = plan_attention(grid, num_ranks, shape, config=config, granularity=granularity,
                            ranks_per_node=ranks_per_node, topology=topology)
    candidates = chosen.info.get("candidates", [])
    assert isinstance(candidates, Sequence)
    rows = [_row_from_candidate(row, chosen) for row in candidates]
    uly = ulysses_stats(grid, shape, num_ranks)
    if uly is not None:
        rows.append(SchemeRow(
            scheme="ulysses", layout="contiguous", staging="single",
            max_forward_inbound=uly.max_forward_inbound, max_inbound=uly.max_inbound,
            max_port=uly.max_port, total_bytes=uly.total_bytes, balance=uly.balance,
            max_messages=max(uly.messages), num_collectives=uly.num_collectives,
            unused_bytes=sum(uly.unused_in), estimate_s=None,
            note="splits heads: not a block plan, not priced"))
    else:
        rows.append(SchemeRow("ulysses", "-", "-", 0, 0, 0, 0, 0.0, 0, 0, 0, None,
                              note=f"n/a: {num_ranks} ranks must divide the "
                              f"{shape.num_heads} query and {shape.num_kv_heads} kv heads"))
    return SchemeComparison(grid=grid, num_ranks=num_ranks, shape=shape, chosen=chosen,
                            rows=tuple(rows), unit_bytes=int(block_units(chosen)))


def _units(value: int, unit: int) -> str:
    return f"{value / unit:.1f}" if unit else str(value)


def scheme_table(comparison: SchemeComparison, *, title: str) -> RichTable:
    """The comparison as a rich table; bytes also in units of one Q block (design note)."""
    from rich.table import Table

    from furnace.runtime.comm import format_bytes

    unit = comparison.unit_bytes
    notes = [f"{r.scheme} ({r.layout}): {r.note}" for r in comparison.rows if r.note]
    table = Table(title=title, caption="\n".join([
        f"unit = one Q block = {format_bytes(unit)}; max = busiest rank; * = kept; estimate = "
        "closed-form time on the planner's topology (modelled)", *notes]))
    for name in ("scheme", "layout", "staging", "fwd in max", "fwd+bwd in max", "port max", "total",
                 "units fwd/all", "balance", "msgs max", "a2a calls", "unused", "estimate"):
        table.add_column(name, justify="left" if name in ("scheme", "layout") else "right",
                         no_wrap=True)
    for r in comparison.rows:
        if r.scheme == "ulysses" and r.note.startswith("n/a"):
            table.add_row(r.scheme, "-", "-", *["-"] * 10)
            continue
        table.add_row(
            ("* " if r.chosen else "") + r.scheme, r.layout, r.staging,
            format_bytes(r.max_forward_inbound), format_bytes(r.max_inbound),
            format_bytes(r.max_port), format_bytes(r.total_bytes),
            f"{_units(r.max_forward_inbound, unit)}/{_units(r.max_inbound, unit)}",
            f"{r.balance:.3f}", str(r.max_messages), str(r.num_collectives),
            format_bytes(r.unused_bytes),
            "-" if r.estimate_s is None else f"{r.estimate_s * 1e3:.3f} ms")
    return table


_RANK_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def assignment_matrix(plan: Plan) -> np.ndarray:
    """(P, P) int array: the rank that computes each block, -1 for empty blocks."""
    num_blocks = plan.grid.num_blocks
    ranks = np.full((num_blocks, num_blocks), -1, dtype=np.int64)
    for (r, c), g in plan.assignment.items():
        ranks[r, c] = g
    return ranks


def tiling_picture(plan: Plan) -> str:
    """The tiling as text: one character per block, the computing rank ('.' empty)."""
    ranks = assignment_matrix(plan)
    lines = [f"{plan.scheme} ({plan.layout.kind}) on {plan.num_ranks} ranks: block (q row, "
             "kv column) -> computing rank; owners of each block row on the left"]
    for r in range(ranks.shape[0]):
        cells = "".join("." if g < 0 else _RANK_SYMBOLS[g % len(_RANK_SYMBOLS)]
                        for g in ranks[r])
        lines.append(f"{_RANK_SYMBOLS[plan.layout.owner(r) % len(_RANK_SYMBOLS)]} | {cells}")
    return "\n".join(lines)


def plot_tiling(plan: Plan, ax: Any, *, title: str | None = None) -> None:
    """Draw the tiling on matplotlib axes ``ax``: each block coloured by its rank."""
    from matplotlib import colormaps
    from matplotlib.colors import ListedColormap

    ranks = assignment_matrix(plan)
    base = colormaps["tab10" if plan.num_ranks <= 10 else "tab20"]
    colours = [base(i % base.N) for i in range(plan.num_ranks)]
    cmap = ListedColormap([(1.0, 1.0, 1.0, 1.0), *colours])
    ax.imshow(ranks + 1, cmap=cmap, vmin=0, vmax=plan.num_ranks, interpolation="nearest")
    partial = (plan.grid.kinds != EMPTY) & (plan.grid.counts < _full_counts(plan.grid))
    ys, xs = np.nonzero(partial)
    ax.scatter(xs, ys, s=4, c="black", marker=".", linewidths=0)
    ax.set_xlabel("key/value block")
    ax.set_ylabel("query block")
    ax.set_title(title or f"{plan.scheme} ({plan.layout.kind})", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def _full_counts(grid: BlockGrid) -> np.ndarray:
    lens = np.asarray(grid.block_lens, dtype=np.int64)
    return np.outer(lens, lens)
