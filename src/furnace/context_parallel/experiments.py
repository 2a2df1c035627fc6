"""`furnace reproduce context_parallel`: UltraAttn (Yang et al., SC'25) on a CPU: the traffic
table of every mask and scheme, the tiling pictures, measured time side by side on the
emulated network, the simulator's validation, and the simulated scaling next to the paper.

Experiments (issue 14, item 7; the quick set runs every entry at reduced size):

- ``traffic``: for every mask and every scheme at 4 and 8 ranks (16 blocks, one head as the
  paper's Nh=1 configuration): the busiest rank's inbound bytes forward and forward plus
  backward, in the design note's units (one Q block), the compute balance (max/mean of the
  exact mask element counts), messages, and which plan the planner keeps; with pictures of
  the kept tilings coloured by rank. Counts, machine-independent. Claims: causal at 4 ranks
  tiled <= 0.75 of ring; strided, global+local and document <= 1/3 of ring; balance <= 1.1
  in every case; the kept plan never worse than the best baseline (closed-form estimate).
- ``heuristic_gap``: the greedy tiling's objective against the ILP's optimum on small
  instances (design note §6.5 item 4), and the ILP's solve times.
- ``measured``: ring against the tiled plan, forward plus backward, at 4 gloo ranks over
  the emulated network (`furnace.runtime.netem`, sleep mode), interleaved rounds, medians and
  the paired median ratio per sparse mask; every output checked against the dense
  reference and every logged byte against the plan. Emulated time.
- ``simulator_validation``: the discrete-event simulator (`simulate`) against those
  emulated runs at 2, 4 and 8 ranks on three masks (quick: 2 and 4 ranks, strided): the
  ratio per run within 2x, and R^2 >= 0.8 on the full set. Only then does ``scaling``
  extrapolate.
- ``scaling``: ring, zigzag ring and the hierarchical tiling projected to 64-1024 H100s
  (quick: 64) on long sequences, simulated, next to the paper's 5.5x average over
  ring on irregular masks at 64 GPUs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from furnace.runtime.reproduce import Claim, Experiment, Result, RunContext, Table

from .compare import SchemeComparison, compare_schemes, plot_tiling
from .context_tiling import TilingConfig, ilp_gap
from .layout import make_layout
from .masks import MASK_NAMES, build_block_grid, make_mask
from .plan import AttentionShape

__all__ = ["EXPERIMENTS", "TrafficConfig", "traffic_comparisons", "traffic_result"]

PAPER = "Yang et al., UltraAttn, SC'25"
SPARSE_MASKS = ("sliding_window", "strided", "global_local", "star", "streaming", "document",
                "random")
ONE_THIRD_MASKS = ("strided", "global_local", "document")
QUICK_MEASURED_MASKS = ("strided", "document")
MEASURED_BANDWIDTH_BPS = 100e6
MEASURED_LATENCY_S = 1e-3
VALIDATION_FACTOR = 2.0
VALIDATION_R2 = 0.8
VALIDATION_MIN_RUNS = 6
CAUSAL_TARGET = 0.75
SPARSE_TARGET = 1.0 / 3.0
BALANCE_TARGET = 1.1


@dataclass(frozen=True)
class TrafficConfig:
    """The traffic table's problem: the paper's Llama2-7B attention shape (32 heads of 128,
    bf16, design note §3) on 4 blocks per rank (16 at 4 ranks, as design note §6.4)."""

    seq_len: int = 4096
    blocks_per_rank: int = 4
    rank_counts: tuple[int, ...] = (4, 8)
    masks: tuple[str, ...] = MASK_NAMES
    num_heads: int = 32
    head_dim: int = 128
    dtype: str = "bfloat16"
    time_limit_s: float = 0.5
    greedy_time_s: float = 0.3

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(batch=1, num_heads=self.num_heads, num_kv_heads=self.num_heads,
                              head_dim=self.head_dim, dtype=self.dtype)

    @property
    def tiling(self) -> TilingConfig:
        return TilingConfig(time_limit_s=self.time_limit_s, greedy_time_s=self.greedy_time_s)


def traffic_comparisons(config: TrafficConfig,
                        progress: Any = None) -> dict[tuple[str, int], SchemeComparison]:
    """compare_schemes for every (mask, ranks) of ``config``."""
    out: dict[tuple[str, int], SchemeComparison] = {}
    for mask_name in config.masks:
        mask = make_mask(mask_name, config.seq_len)
        for ranks in config.rank_counts:
            if progress is not None:
                progress(f"traffic: {mask_name} on {ranks} ranks")
            num_blocks = config.blocks_per_rank * ranks
            grid = build_block_grid(mask, config.seq_len, -(-config.seq_len // num_blocks))
            out[(mask_name, ranks)] = compare_schemes(grid, ranks, config.shape,
                                                      config=config.tiling)
    return out


def _units(value: int, unit: int) -> float:
    return round(value / unit, 2)


def traffic(ctx: RunContext) -> Result:
    # the quick set searches each tiling for less time: the same tables, possibly weaker ILPs
    config = TrafficConfig(time_limit_s=0.3, greedy_time_s=0.15) if ctx.quick else TrafficConfig()
    return traffic_result(ctx, config)


def traffic_result(ctx: RunContext, config: TrafficConfig) -> Result:
    """The traffic table, its claims and the tiling figure for ``config``."""
    found = ctx.shared(("context_parallel", "traffic", config),
                       lambda: traffic_comparisons(config, ctx.progress))
    rows: list[list[Any]] = []
    claims = []
    ratio_rows: list[list[Any]] = []
    for (mask_name, ranks), comp in found.items():
        unit = comp.unit_bytes
        for r in comp.rows:
            if r.scheme == "ulysses" and r.note.startswith("n/a"):
                continue
            rows.append([mask_name, ranks, ("* " if r.chosen else "") + r.scheme, r.layout,
                         _units(r.max_forward_inbound, unit), _units(r.max_inbound, unit),
                         _units(r.total_bytes, unit), round(r.balance, 3), r.max_messages,
                         r.num_collectives,
                         "-" if r.estimate_s is None else f"{r.estimate_s * 1e6:.1f}"])
        chosen = next(r for r in comp.rows if r.chosen)
        best = comp.best_baseline()
        tiled = comp.row("tiled") if comp.has_tiled else None
        ratio_rows.append([
            mask_name, ranks, chosen.scheme,
            "-" if tiled is None else f"{tiled.scheme} ({tiled.layout})",
            "-" if tiled is None else round(comp.ratio_to_ring(tiled.scheme,
                                                               "max_forward_inbound"), 3),
            "-" if tiled is None else round(comp.ratio_to_ring(tiled.scheme), 3),
            "-" if tiled is None else round(tiled.balance, 3), round(chosen.balance, 3),
            best.scheme, round((chosen.estimate_s or 0.0) / (best.estimate_s or 1.0), 3)])
    ratios = {(row[0], row[1]): row for row in ratio_rows}
    causal = ratios.get(("causal", 4))
    if causal is not None:
        claims.append(Claim(
            "causal, 4 ranks: 2-D tiling's busiest inbound (fwd+bwd) / ring's",
            f"<= {CAUSAL_TARGET} (issue 14; the paper's Fig. 1: zigzag ring takes in 2x "
            "UltraAttn's Q/KV traffic)", f"{causal[5]} (forward only {causal[4]})",
            "analytic", PAPER, holds=isinstance(causal[5], float)
            and causal[5] <= CAUSAL_TARGET))
    for mask_name in ONE_THIRD_MASKS:
        row = ratios.get((mask_name, 4))
        if row is None:
            continue
        claims.append(Claim(
            f"{mask_name}, 4 ranks: 2-D tiling's busiest inbound (fwd+bwd) / ring's",
            "<= 1/3 (issue 14)", f"{row[5]} (forward only {row[4]})", "analytic", PAPER,
            holds=isinstance(row[5], float) and row[5] <= SPARSE_TARGET))
    balances = [row for row in ratio_rows if isinstance(row[6], float)]
    worst_balance = max(balances, key=lambda row: row[6])
    claims.append(Claim(
        "compute balance max/mean of the 2-D tiling, every mask at 4 and 8 ranks",
        f"<= {BALANCE_TARGET} (issue 14)",
        f"worst {worst_balance[6]} ({worst_balance[0]}, {worst_balance[1]} ranks)",
        "analytic", PAPER, holds=len(balances) == len(ratio_rows)
        and worst_balance[6] <= BALANCE_TARGET))
    worst_vs_best = max(ratio_rows, key=lambda row: row[9])
    claims.append(Claim(
        "kept plan's estimate / best baseline's, every mask at 4 and 8 ranks",
        "<= 1 (never worse than the best baseline)",
        f"worst {worst_vs_best[9]} ({worst_vs_best[0]}, {worst_vs_best[1]} ranks)",
        "analytic", PAPER, holds=worst_vs_best[9] <= 1.0 + 1e-12))
    result = Result(
        tables=[
            Table("Tiled vs ring per mask: busiest-rank inbound ratio and balance",
                  ["mask", "ranks", "kept", "2-D tiling", "tiled/ring fwd",
                   "tiled/ring fwd+bwd", "tiled balance", "kept balance", "best baseline",
                   "kept/best estimate"], ratio_rows,
                  "analytic", note="Counts of the plans' transfers and of the mask's exact "
                  f"elements; S = {config.seq_len}, {config.blocks_per_rank} blocks per "
                  f"rank, {config.num_heads} heads of {config.head_dim}, {config.dtype}. "
                  "The ratios are of the cheapest 2-D tiling (any layout); `kept` is what "
                  "the planner returns. `furnace cp plan --mask M --ranks N --num-blocks "
                  f"{config.blocks_per_rank}N --heads {config.num_heads} --kv-heads "
                  f"{config.num_heads} --head-dim {config.head_dim} --dtype {config.dtype} "
                  f"--seq-len {config.seq_len}` prints one row group."),
            Table("Traffic per scheme (units of one Q block; busiest rank)",
                  ["mask", "ranks", "scheme", "layout", "fwd in", "fwd+bwd in", "total",
                   "balance", "msgs", "a2a calls", "estimate us"], rows, "analytic",
                  note="* = the plan the planner keeps (lowest closed-form estimate on "
                  "the h100-ib preset, modelled). Ulysses splits heads, so it is shown but "
                  "not a block plan the planner can keep.")],
        claims=claims)
    result.figures.append(_tiling_figure(ctx, found, min(config.rank_counts)))
    return result


def _tiling_figure(ctx: RunContext, found: dict[tuple[str, int], SchemeComparison],
                   ranks: int) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = [(m, c) for (m, r), c in found.items() if r == ranks]
    cols = min(5, len(picks))
    rows = -(-len(picks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (mask_name, comp) in zip(axes.flat, picks):
        ax.set_axis_on()
        plot_tiling(comp.chosen, ax, title=f"{mask_name}: {comp.chosen.scheme}")
    fig.suptitle(f"Kept plans on {ranks} ranks: each block coloured by the rank that "
                 "computes it (dots: partial blocks)", fontsize=10)
    fig.tight_layout()
    path = ctx.save_figure(fig, f"context_parallel_tiling_{ranks}ranks")
    plt.close(fig)
    return path


def heuristic_gap(ctx: RunContext) -> Result:
    shape = AttentionShape(num_heads=1, num_kv_heads=1, head_dim=64)
    seq_len, num_blocks = 1024, 8 if ctx.quick else 16
    masks = ("causal", "strided", "global_local") if ctx.quick else MASK_NAMES
    tiling = TilingConfig(time_limit_s=2.0 if ctx.quick else 30.0)
    rows: list[list[Any]] = []
    for mask_name in masks:
        grid = build_block_grid(make_mask(mask_name, seq_len), seq_len,
                                -(-seq_len // num_blocks))
        for ranks in (2, 4):
            ctx.progress(f"heuristic gap: {mask_name} on {ranks} ranks")
            gap = ilp_gap(grid, make_layout("zigzag", num_blocks, ranks), shape, tiling)
            rows.append([mask_name, ranks, gap.get("ilp_status"),
                         _fmt(gap.get("ilp")), _fmt(gap.get("greedy")),
                         _fmt(gap.get("gap")), _fmt(gap.get("ilp_s"))])
    gaps = [float(r[5]) for r in rows if r[5] != "-" and r[2] == "optimal"]
    claims = [Claim("greedy tiling's objective / ILP optimum on small instances",
                    "not reported (the paper solves every instance with Gurobi)",
                    f"median {statistics.median(gaps):.3f}, worst {max(gaps):.3f}"
                    if gaps else "no optimal instance", "analytic", PAPER)]
    return Result(tables=[Table(
        f"Greedy vs ILP (HiGHS) on the zigzag layout, S = {seq_len}, P = {num_blocks}",
        ["mask", "ranks", "ILP status", "ILP objective", "greedy objective",
         "greedy / ILP", "ILP solve s"], rows, "analytic",
        note="Objective: the busiest port's forward+backward traffic in Q-block units "
        "(design note §2.3). Solve time measured on this machine.")], claims=claims)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def measured(ctx: RunContext) -> Result:
    from .bench import BenchConfig, measure_schemes

    masks = QUICK_MEASURED_MASKS if ctx.quick else SPARSE_MASKS
    rows = []
    claims = []
    for mask_name in masks:
        ctx.progress(f"measured: {mask_name} on 4 emulated ranks")
        config = BenchConfig(mask=mask_name, seq_len=512, num_blocks=16, num_ranks=4,
                             num_heads=2, num_kv_heads=2, head_dim=32,
                             schemes=("ring", "tiled_2d", "tiled"),
                             repeats=5 if ctx.quick else 9, time_limit_s=0.5,
                             bandwidth_Bps=MEASURED_BANDWIDTH_BPS, latency_s=MEASURED_LATENCY_S)
        res = measure_schemes(config)
        ring, tiling, kept = res.scheme("ring"), res.scheme("tiled_2d"), res.scheme("tiled")
        rows.append([mask_name, f"{ring.median_s * 1e3:.1f}",
                     f"{tiling.plan_scheme} ({tiling.layout})", f"{tiling.median_s * 1e3:.1f}",
                     _fmt(tiling.ratio), f"{kept.plan_scheme} ({kept.layout})",
                     f"{kept.median_s * 1e3:.1f}", _fmt(kept.ratio),
                     all(x.correct for x in (ring, tiling, kept)),
                     all(x.bytes_match for x in (ring, tiling, kept))])
        claims.append(Claim(f"{mask_name}, 4 ranks: 2-D tiling / ring time, fwd+bwd (paired "
                            "median)", "< 1 (issue 14); the paper: 1.9-10.2x over the best "
                            "baseline on sparse masks at 8-64 GPUs",
                            f"{_fmt(tiling.ratio)} (planner's plan: {_fmt(kept.ratio)})",
                            "emulated", PAPER,
                            holds=tiling.ratio is not None and tiling.ratio < 1.0))
    return Result(tables=[Table(
        "Ring vs the 2-D tiling and vs the planner's plan at 4 gloo ranks on the emulated "
        "network", ["mask", "ring ms", "2-D tiling", "ms", "/ring", "planner's plan", "ms",
                    "/ring", "outputs exact", "bytes == plan"], rows, "emulated",
        note="S = 512, 16 blocks, 2 heads of 32, fp32, forward+backward, 4 ranks; links of "
        f"{MEASURED_BANDWIDTH_BPS / 1e6:.0f} MB/s and {MEASURED_LATENCY_S * 1e3:.0f} ms per "
        "message (netem sleep mode); compute is real and shares this machine's cores; "
        "interleaved rounds, paired median ratios. The planner prices every candidate on "
        "this emulated link and may keep a baseline. `furnace cp bench --mask M --schemes "
        "ring,tiled_2d,tiled` prints one row.")],
        claims=claims)


def _validation(ctx: RunContext) -> Any:
    """The validation runs of this reproduce (shared: ``scaling`` checks them first)."""
    from .simulate import ValidationConfig, validate

    config = ValidationConfig.quick() if ctx.quick else ValidationConfig()
    return ctx.shared(("context_parallel", "validation", config),
                      lambda: validate(config, progress=ctx.progress))


def simulator_validation(ctx: RunContext) -> Result:
    res = _validation(ctx)
    rows = [[r.num_ranks, r.mask, r.scheme, r.plan_scheme, f"{r.measured_s * 1e3:.1f}",
             f"{r.simulated_s * 1e3:.1f}", f"{r.ratio:.3f}"] for r in res.rows]
    r2 = res.r_squared
    ratios = [r.ratio for r in res.rows]
    within = all(1.0 / VALIDATION_FACTOR <= x <= VALIDATION_FACTOR for x in ratios)
    # R^2 over a handful of runs of one size says little: it is judged on the full set only
    judged = len(rows) >= VALIDATION_MIN_RUNS
    ours = (f"R^2 {r2:.3f} over {len(rows)} runs"
            + ("" if judged else " (too few runs to judge R^2; the full set has 18)")
            + f"; emulated/simulated {min(ratios):.2f}-{max(ratios):.2f}")
    return Result(tables=[Table(
        "Simulator vs emulated runs", ["ranks", "mask", "scheme", "plan", "emulated ms",
                                       "simulated ms", "emulated/simulated"], rows,
        "simulated", note="Emulated: measured wall time over netem links; simulated: "
        "`simulate.simulate_plan` with the CPU compute model fitted on this machine "
        f"({res.compute.describe()}).")],
        claims=[Claim("simulator against emulated runs (the validation before projecting)",
                      f"R^2 0.9932 intra-node, 0.9181 inter-node (paper Fig. 11); ours: every "
                      f"run within {VALIDATION_FACTOR:g}x, R^2 >= {VALIDATION_R2} on the full "
                      "set", ours, "simulated", PAPER,
                      holds=within and (r2 >= VALIDATION_R2 or not judged))],
        data={"validation": res.to_dict()})


def scaling(ctx: RunContext) -> Result:
    from .simulate import scaling_study, scaling_study_quick

    ratios = [r.ratio for r in _validation(ctx).rows]
    if not all(1.0 / VALIDATION_FACTOR <= x <= VALIDATION_FACTOR for x in ratios):
        raise RuntimeError(f"the simulator is not within {VALIDATION_FACTOR:g}x of the emulated "
                           f"runs (emulated/simulated {min(ratios):.2f}-{max(ratios):.2f}): "
                           "no projection")
    # quick: 64 GPUs, where the paper quotes its average
    study = scaling_study_quick(rank_counts=(64,)) if ctx.quick else scaling_study()
    rows = [[r.mask, r.num_ranks, r.scheme, f"{r.ring_s * 1e3:.2f}",
             f"{r.zigzag_ring_s * 1e3:.2f}", f"{r.tiled_s * 1e3:.2f}",
             f"{r.speedup_vs_ring:.2f}", f"{r.speedup_vs_best_ring:.2f}",
             round(r.tiled_balance, 3)] for r in study.rows]
    counts = sorted({r.num_ranks for r in study.rows})
    first = counts[0]
    mean = study.mean_speedup(first)
    return Result(tables=[Table(
        "Simulated scaling on h100-ib (8 GPUs a node, one 400 Gb/s NIC per GPU)",
        ["mask", "GPUs", "kept", "ring ms", "zigzag ring ms", "tiled ms", "vs ring",
         "vs best ring", "balance"], rows, "simulated",
        note="Assumptions: " + "; ".join(f"{k}: {v}" for k, v in study.assumptions.items()))],
        claims=[Claim(f"mean speedup over ring on irregular masks at {first} GPUs",
                      "5.5x (paper, 64 GPUs)", f"{mean:.2f}x", "simulated", PAPER)],
        data={"scaling": study.to_dict()})


EXPERIMENTS = [
    Experiment("context_parallel", "traffic", "Traffic, balance and tiling of every mask and "
               "scheme at 4 and 8 ranks (counts)", traffic),
    Experiment("context_parallel", "heuristic_gap", "Greedy tiling vs the ILP optimum",
               heuristic_gap),
    Experiment("context_parallel", "measured", "Ring vs tiled at 4 ranks on the emulated "
               "network", measured),
    Experiment("context_parallel", "simulator_validation", "The simulator against emulated "
               "runs at 2-8 ranks", simulator_validation),
    Experiment("context_parallel", "scaling", "Simulated scaling to 64-1024 GPUs next to the "
               "paper's 5.5x", scaling),
]
