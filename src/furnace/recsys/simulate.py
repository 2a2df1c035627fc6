"""Two-level cluster simulator of pattern-aware sparse communication, 8-512 GPUs (design
note `recsys.md` Sec. 2.4 "Performance model" and "Crossover", Sec. 3, Sec. 7 "Simulator
for 8-512 GPUs"). Every number it produces is labelled "simulated".

The poster's 32-GPU testbed is not available, so the system is projected with the same
[recon] performance model the planner uses (`perfmodel`):

- probabilities: the synthetic click log's exact per-lookup row probabilities
  (`data.SyntheticClickLog.probabilities`) on Criteo-Kaggle tables scaled by ``row_scale``;
  nothing is sampled, so W = 512 costs as little as W = 8;
- bytes: `perfmodel.expected_phase_bytes`, the closed-form expectation of what each rank
  sends per phase (the common byte encoding of `engine` and `accounting`);
- time: `perfmodel.iteration_time`, the busiest rank's critical path over a two-level
  cluster (NVLink inside a node, InfiniBand across nodes, `runtime.presets`), with the
  dense compute (`model.dense_flops`, forward + 2x backward) at the preset device's fp32
  peak times an attainable fraction (`runtime.cost.roofline_time`). Embedding lookups,
  kernel launches and the sparse optimizer are not modelled.

`simulate_scaling` runs the four schemes (table_pooled, row, row_dedup, hybrid with the
planner's hot set) at every world size, hybrid both unscheduled and scheduled (all-to-all
overlapped with compute, hot and dense all-reduce fused: Sec. 2.5). `crossover` sweeps the
hot-set size K on a flat fabric (every rank its own node, ring all-reduce) and on the
two-level fabric, showing where the hot all-reduce costs more than it saves: on a flat
fabric replication only pays for rows nearly every rank touches every iteration
(`break_even_touches`). `validate_bytes` and `validate_times` compare the model with
measured byte counters and emulated wall-clock times; `experiments.py` wires the real
measurements in. The ``*_table`` helpers render results as `reproduce.Table`.

What the model says on the H100 preset (simulated): for one-hot Criteo-like batches the
planner replicates little, and dedup carries most of the speedup over table_pooled; with
multi-hot bags (the measured setting's) the exchange is heavier and replication of the rows
most ranks touch pays across nodes, where the hierarchical all-reduce is cheaper per byte
than the all-to-all. With the schedule only the prefetched ID exchange hides behind compute
(`perfmodel.iteration_time`); a separate hot all-reduce pays ``2(W-1)``-ish latency steps,
which the fused one avoids. `crossover` shows the regimes where replication pays and the
flat fabric where it loses. `experiments.py` checks the model's step times against emulated
runs at 4 and 8 ranks before it projects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from furnace.runtime.cost import roofline_time
from furnace.runtime.presets import PRESETS, get_preset
from furnace.runtime.reproduce import Kind, Table
from furnace.runtime.topology import Topology

from .config import (
    SCHEMES,
    SPARSE_OPTIMIZERS,
    DataConfig,
    ModelConfig,
    PlanError,
    ShardingPlan,
    scaled_table_rows,
)
from .data import SyntheticClickLog
from .model import dense_flops
from .perfmodel import ClusterModel, expected_phase_bytes, iteration_time
from .plan import choose_hot_set, hot_row_bytes, make_plan, ranked_rows

__all__ = [
    "ALL_REDUCE_PHASES",
    "ALL_TO_ALL_PHASES",
    "BytesValidation",
    "CrossoverResult",
    "CrossoverRow",
    "PAPER_SPEEDUP_RANGE",
    "SCENARIOS",
    "ScalingRow",
    "ScalingStudy",
    "SchemeModel",
    "SimulationConfig",
    "TimeValidation",
    "break_even_touches",
    "bytes_validation_table",
    "crossover",
    "crossover_table",
    "dense_param_count",
    "flat_cluster",
    "model_schemes",
    "scaling_bytes_table",
    "scaling_table",
    "simulate_scaling",
    "time_validation_table",
    "validate_bytes",
    "validate_times",
]

# What `model_schemes` evaluates: the four schemes unscheduled, and hybrid with the schedule
# of Sec. 2.5 (a2a behind compute, one fused all-reduce).
SCENARIOS: tuple[str, ...] = (*SCHEMES, "hybrid_scheduled")
ALL_TO_ALL_PHASES: tuple[str, ...] = ("splits", "ids", "vectors", "grads")
ALL_REDUCE_PHASES: tuple[str, ...] = ("dense_allreduce", "hot_allreduce", "allreduce")
# the backward pass of the dense part costs about twice its forward (TorchRec's planner
# constant BWD_COMPUTE_MULTIPLIER, design note Sec. 4)
BACKWARD_FACTOR = 2.0
# the poster's headline, quoted next to simulated numbers only (design note Sec. 3)
PAPER_SPEEDUP_RANGE = (2.16, 16.8)


@dataclass(frozen=True)
class SimulationConfig:
    """One projection's workload and machine.

    Attributes:
        world_sizes: the GPU counts W to project to.
        ranks_per_node: GPUs per node (NVLink inside, the preset's inter-node link across).
        preset: a `runtime.presets` topology name (device and links).
        zipf_exponent: s of the per-table Zipf law (synthetic data, Sec. 6).
        row_scale: Criteo-Kaggle cardinalities times this (`config.scaled_table_rows`).
        batch_size_per_rank: B_l.
        embedding_dim: D.
        bag_size: IDs per bag (1: one-hot, Criteo).
        optimizer: the sparse optimizer; row-wise Adagrad adds one element per hot row.
        memory_budget_bytes: per-rank memory the hot replicas may use.
        bottom_hidden, top_mlp: DLRM's MLP widths; the bottom MLP ends in D (appended).
            Defaults: the DLRM reference's Criteo-Kaggle arch ``13-512-256-64-D`` /
            ``512-256-1`` [recall].
        num_dense: dense features per sample.
        compute_efficiency: attained fraction of the device's fp32 peak for the dense part
            (an assumption).
        element_bytes, id_bytes: bytes of a weight element and of a row ID.
        touched_counts: whether the hot all-reduce carries touched-row counts (needed only
            with weight decay, `engine.needs_touched_counts`).
        seed: seeds the synthetic log's rank-to-row permutation.
    """

    world_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)
    ranks_per_node: int = 8
    preset: str = "h100-ib"
    zipf_exponent: float = 1.05
    row_scale: float = 1e-2
    batch_size_per_rank: int = 512
    embedding_dim: int = 16
    bag_size: int = 1
    optimizer: str = "sgd"
    memory_budget_bytes: float = 256 * 2**20
    bottom_hidden: tuple[int, ...] = (512, 256, 64)
    top_mlp: tuple[int, ...] = (512, 256, 1)
    num_dense: int = 13
    compute_efficiency: float = 0.35
    element_bytes: int = 4
    id_bytes: int = 8
    touched_counts: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = self.world_sizes
        if not sizes or any(not isinstance(w, int) or isinstance(w, bool) or w < 1
                            for w in sizes):
            raise PlanError("world_sizes", f"must be ints >= 1, got {sizes!r}")
        for name in ("ranks_per_node", "batch_size_per_rank", "embedding_dim", "bag_size",
                     "num_dense", "element_bytes", "id_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(name, f"must be an int >= 1, got {value!r}")
        if self.preset not in PRESETS:
            raise PlanError("preset", f"must be one of {', '.join(sorted(PRESETS))}, "
                            f"got {self.preset!r}")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise PlanError("optimizer", f"must be one of {', '.join(SPARSE_OPTIMIZERS)}, "
                            f"got {self.optimizer!r}")
        budget = self.memory_budget_bytes
        if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget >= 0):
            raise PlanError("memory_budget", f"must be >= 0 bytes, got {budget!r}")
        eff = self.compute_efficiency
        if not (isinstance(eff, (int, float)) and 0 < eff <= 1):
            raise PlanError("compute_efficiency", f"must be in (0, 1], got {eff!r}")
        # the data and model configs check their own fields (zipf_exponent, row_scale, MLPs)
        self.data_config()
        self.model_config()

    def table_rows(self) -> tuple[int, ...]:
        return scaled_table_rows(self.row_scale)

    def data_config(self) -> DataConfig:
        return DataConfig(table_rows=self.table_rows(), num_dense=self.num_dense,
                          zipf_exponent=self.zipf_exponent, bag_size=self.bag_size,
                          seed=self.seed)

    def model_config(self) -> ModelConfig:
        return ModelConfig(embedding_dim=self.embedding_dim,
                           bottom_mlp=(*self.bottom_hidden, self.embedding_dim),
                           top_mlp=self.top_mlp)

    def topology(self) -> Topology:
        return get_preset(self.preset, gpus_per_node=self.ranks_per_node)

    def cluster(self, world_size: int) -> ClusterModel:
        return ClusterModel.from_topology(self.topology(), world_size)

    def compute_seconds(self) -> float:
        """Dense forward + backward of one local batch at the attained fraction of peak."""
        flops = dense_flops(self.model_config(), self.num_dense, len(self.table_rows()),
                            self.batch_size_per_rank) * (1.0 + BACKWARD_FACTOR)
        return roofline_time(self.topology().device, flops) / self.compute_efficiency

    def dense_param_count(self) -> int:
        return dense_param_count(self.model_config(), self.num_dense, len(self.table_rows()))


def dense_param_count(config: ModelConfig, num_dense: int, num_tables: int) -> int:
    """Parameters of DLRM's dense part (what "dense_allreduce" carries), as `model.DLRM`
    lays it out: the MLPs' weights and biases, the cross layers for "dcn"."""
    d = config.embedding_dim
    features = num_tables + 1
    count = 0
    fan_in = num_dense
    for width in config.bottom_mlp:
        count += fan_in * width + width
        fan_in = width
    if config.interaction == "dot":
        fan_in = d + features * (features - 1) // 2
    else:
        fan_in = features * d
        count += config.cross_layers * (fan_in * fan_in + fan_in)
    for width in config.top_mlp:
        count += fan_in * width + width
        fan_in = width
    return count


def flat_cluster(topology: Topology, world_size: int) -> ClusterModel:
    """Every rank its own node on the topology's inter-node link: the flat fabric of the
    design note's crossover calculation (ring all-reduce, no NVLink to reduce within)."""
    link = topology.inter_node
    return ClusterModel(ranks_per_node=1, num_nodes=world_size, intra=link, inter=link,
                        name=f"flat {link.name}")


# --------------------------------------------------------------------------- schemes


@dataclass(frozen=True)
class SchemeModel:
    """One scheme's modelled iteration (label "simulated"): expected bytes each rank sends
    per phase, and the critical-path time."""

    scenario: str
    plan: ShardingPlan
    phase_bytes: Mapping[str, np.ndarray]
    seconds: float
    overlap: bool
    label: str = "simulated"

    def busiest_bytes(self) -> dict[str, float]:
        """Per phase, the most bytes any one rank sends."""
        return {phase: float(np.max(v)) if np.size(v) else 0.0
                for phase, v in self.phase_bytes.items()}

    def busiest_rank_total(self) -> float:
        """The most bytes any one rank sends, all phases together."""
        arrays = [np.asarray(v, dtype=np.float64) for v in self.phase_bytes.values()]
        return float(np.max(np.sum(arrays, axis=0))) if arrays else 0.0


def _model(probabilities: np.ndarray, scenario: str, plan: ShardingPlan, cluster: ClusterModel,
           *, batch_size_per_rank: int, embedding_dim: int, bag_size: int, element_bytes: int,
           id_bytes: int, dense_param_count: int, compute_s: float, touched_counts: bool,
           overlap: bool, fuse_allreduce: bool) -> SchemeModel:
    scheme = "hybrid" if scenario == "hybrid_scheduled" else scenario
    phases = expected_phase_bytes(
        probabilities, plan=plan, scheme=scheme, batch_size_per_rank=batch_size_per_rank,
        embedding_dim=embedding_dim, bag_size=bag_size, element_bytes=element_bytes,
        id_bytes=id_bytes, dense_param_count=dense_param_count, touched_counts=touched_counts,
        fuse_allreduce=fuse_allreduce)
    seconds = iteration_time(phases, cluster, compute_s=compute_s, overlap=overlap)
    return SchemeModel(scenario, plan, dict(phases), float(seconds), overlap)


def model_schemes(probabilities: np.ndarray, *, table_rows: tuple[int, ...], world_size: int,
                  cluster: ClusterModel, batch_size_per_rank: int, embedding_dim: int,
                  hot_rows: Sequence[int] = (), scheduled_hot_rows: Sequence[int] | None = None,
                  bag_size: int = 1, element_bytes: int = 4, id_bytes: int = 8,
                  dense_param_count: int = 0, compute_s: float = 0.0,
                  touched_counts: bool = False,
                  scenarios: Sequence[str] = SCENARIOS) -> dict[str, SchemeModel]:
    """Modelled bytes and time of each scenario (`SCENARIOS`) on one cluster.

    ``hot_rows`` is hybrid's hot set and ``scheduled_hot_rows`` hybrid_scheduled's
    (default: the same), from `plan.choose_hot_set` or from a measured run's plan: this is
    also the modelled side of `validate_times`. hybrid_scheduled overlaps the all-to-all
    with compute and fuses the all-reduce (`EngineConfig.scheduled`). table_pooled balances
    tables by lookups (all equal), as the DLRM reference's contiguous blocks do.
    """
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise PlanError("scenarios", f"must be among {', '.join(SCENARIOS)}, got {unknown[0]!r}")
    if scheduled_hot_rows is None:
        scheduled_hot_rows = hot_rows
    out: dict[str, SchemeModel] = {}
    for scenario in scenarios:
        scheme = "hybrid" if scenario == "hybrid_scheduled" else scenario
        scheduled = scenario == "hybrid_scheduled"
        hot = scheduled_hot_rows if scheduled else hot_rows
        plan = make_plan(scheme, table_rows=tuple(table_rows), world_size=world_size,
                         hot_rows=tuple(hot) if scheme == "hybrid" else ())
        out[scenario] = _model(
            probabilities, scenario, plan, cluster, batch_size_per_rank=batch_size_per_rank,
            embedding_dim=embedding_dim, bag_size=bag_size, element_bytes=element_bytes,
            id_bytes=id_bytes, dense_param_count=dense_param_count, compute_s=compute_s,
            touched_counts=touched_counts, overlap=scheduled, fuse_allreduce=scheduled)
    return out


# --------------------------------------------------------------------------- scaling


@dataclass(frozen=True)
class ScalingRow:
    """One world size of the projection (label "simulated"); times in seconds.

    ``seconds``: per scenario (`SCENARIOS`). ``busiest_bytes``: per scenario, per phase,
    the most bytes one rank sends per iteration. ``hot_rows`` is the planner's K for hybrid
    as it runs unscheduled, ``scheduled_hot_rows`` its K for hybrid_scheduled (planned with
    the overlap and the fused all-reduce, which make replication cheaper).
    """

    world_size: int
    num_nodes: int
    seconds: Mapping[str, float]
    busiest_bytes: Mapping[str, Mapping[str, float]]
    hot_rows: int
    hot_memory_bytes_per_rank: float
    planner_reason: str
    scheduled_hot_rows: int
    scheduled_hot_memory_bytes_per_rank: float
    scheduled_planner_reason: str
    compute_s: float
    label: str = "simulated"

    @property
    def speedup_vs_table_pooled(self) -> float:
        """Scheduled hybrid over the DLRM-reference-style baseline (B1)."""
        return self.seconds["table_pooled"] / self.seconds["hybrid_scheduled"]

    @property
    def speedup_vs_row_dedup(self) -> float:
        """Scheduled hybrid over the strong baseline (B3, row-wise + dedup)."""
        return self.seconds["row_dedup"] / self.seconds["hybrid_scheduled"]

    @property
    def unscheduled_speedup_vs_row_dedup(self) -> float:
        """Hybrid without the schedule over B3: what replication alone buys."""
        return self.seconds["row_dedup"] / self.seconds["hybrid"]


@dataclass(frozen=True)
class ScalingStudy:
    """The projection's rows and the assumptions behind them (label "simulated")."""

    config: SimulationConfig
    rows: tuple[ScalingRow, ...]
    assumptions: Mapping[str, str]
    label: str = "simulated"

    def row(self, world_size: int) -> ScalingRow:
        for r in self.rows:
            if r.world_size == world_size:
                return r
        raise KeyError(f"no row at W={world_size}")

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "assumptions": dict(self.assumptions),
                "rows": [{"world_size": r.world_size, "num_nodes": r.num_nodes,
                          "seconds": dict(r.seconds),
                          "busiest_bytes": {s: dict(b) for s, b in r.busiest_bytes.items()},
                          "hot_rows": r.hot_rows,
                          "hot_memory_bytes_per_rank": r.hot_memory_bytes_per_rank,
                          "planner_reason": r.planner_reason,
                          "scheduled_hot_rows": r.scheduled_hot_rows,
                          "scheduled_hot_memory_bytes_per_rank":
                              r.scheduled_hot_memory_bytes_per_rank,
                          "scheduled_planner_reason": r.scheduled_planner_reason,
                          "compute_s": r.compute_s,
                          "speedup_vs_table_pooled": r.speedup_vs_table_pooled,
                          "speedup_vs_row_dedup": r.speedup_vs_row_dedup}
                         for r in self.rows]}


def _assumptions(config: SimulationConfig, topology: Topology) -> dict[str, str]:
    intra, inter = topology.intra_node, topology.inter_node
    rows = config.table_rows()
    return {
        "label": "simulated: [recon] performance model (design note Sec. 2.4), not measured",
        "topology": f"{topology.name}: {config.ranks_per_node} GPUs a node",
        "links": f"intra-node {intra.bandwidth_Bps / 1e9:g} GB/s, {intra.latency_s * 1e6:g} us "
                 f"({intra.name}); inter-node {inter.bandwidth_Bps / 1e9:g} GB/s, "
                 f"{inter.latency_s * 1e6:g} us ({inter.name}); latencies assumed",
        "data": f"synthetic Zipf s={config.zipf_exponent:g}, {len(rows)} Criteo-Kaggle tables "
                f"x {config.row_scale:g} ({sum(rows)} rows), bag size {config.bag_size}, "
                "exact expected bytes (no sampling)",
        "batch": f"{config.batch_size_per_rank} samples per rank, D={config.embedding_dim}, "
                 f"{config.element_bytes}-byte elements, {config.id_bytes}-byte IDs",
        "compute": f"dense fwd + {BACKWARD_FACTOR:g}x bwd at {config.compute_efficiency:g} of "
                   f"{topology.device.name}'s fp32 peak; lookups and optimizer not modelled",
        "hot set": f"plan.choose_hot_set under {config.memory_budget_bytes / 2**20:g} MiB per "
                   f"rank ({config.optimizer}), once per schedule",
        "schedule": "hybrid_scheduled hides the all-to-all behind compute and fuses the "
                    "hot and dense all-reduce; the baselines run unscheduled",
        "table_pooled": "W > tables leaves ranks without a table (the DLRM reference refuses "
                        "that; modelled anyway)",
    }


def simulate_scaling(config: SimulationConfig | None = None) -> ScalingStudy:
    """Every scheme at every world size of ``config`` (label "simulated")."""
    config = config or SimulationConfig()
    topology = config.topology()
    table_rows = config.table_rows()
    probabilities = SyntheticClickLog(config.data_config()).probabilities()
    compute_s = config.compute_seconds()
    dense_params = config.dense_param_count()
    rows = []
    for w in config.world_sizes:
        cluster = ClusterModel.from_topology(topology, w)
        base = make_plan("row_dedup", table_rows=table_rows, world_size=w)
        choices = [choose_hot_set(
            probabilities, plan_base=base, batch_size_per_rank=config.batch_size_per_rank,
            embedding_dim=config.embedding_dim, cluster=cluster,
            memory_budget_bytes=config.memory_budget_bytes, optimizer=config.optimizer,
            bag_size=config.bag_size, element_bytes=config.element_bytes,
            id_bytes=config.id_bytes, compute_s=compute_s, dense_param_count=dense_params,
            touched_counts=config.touched_counts, overlap=scheduled,
            fuse_allreduce=scheduled) for scheduled in (False, True)]
        plain, scheduled_choice = choices
        models = model_schemes(
            probabilities, table_rows=table_rows, world_size=w, cluster=cluster,
            batch_size_per_rank=config.batch_size_per_rank,
            embedding_dim=config.embedding_dim, hot_rows=plain.hot_rows,
            scheduled_hot_rows=scheduled_choice.hot_rows, bag_size=config.bag_size,
            element_bytes=config.element_bytes, id_bytes=config.id_bytes,
            dense_param_count=dense_params, compute_s=compute_s,
            touched_counts=config.touched_counts)
        rows.append(ScalingRow(
            world_size=w, num_nodes=cluster.num_nodes,
            seconds={s: m.seconds for s, m in models.items()},
            busiest_bytes={s: m.busiest_bytes() for s, m in models.items()},
            hot_rows=plain.size, hot_memory_bytes_per_rank=plain.memory_bytes_per_rank,
            planner_reason=plain.reason, scheduled_hot_rows=scheduled_choice.size,
            scheduled_hot_memory_bytes_per_rank=scheduled_choice.memory_bytes_per_rank,
            scheduled_planner_reason=scheduled_choice.reason, compute_s=compute_s))
    return ScalingStudy(config, tuple(rows), _assumptions(config, topology))


# --------------------------------------------------------------------------- crossover


def break_even_touches(world_size: int, embedding_dim: int, element_bytes: int = 4,
                       id_bytes: int = 8) -> float:
    """Remote ranks that must touch a row per iteration before replicating it saves bytes
    on a flat fabric with a ring all-reduce: ``(W-1) 2De / (i + 2De)`` (design note Sec.
    2.4, "Crossover"; about 0.94 (W-1) for D = 16 in fp32)."""
    row = 2.0 * embedding_dim * element_bytes
    return (world_size - 1) * row / (id_bytes + row)


@dataclass(frozen=True)
class CrossoverRow:
    """One (fabric, K) of the sweep (label "simulated"): the hybrid scheme with the K
    hottest rows replicated; bytes are the busiest rank's per iteration."""

    fabric: str
    hot_rows: int
    seconds: float
    all_to_all_bytes: float
    hot_allreduce_bytes: float
    memory_bytes_per_rank: float
    label: str = "simulated"


@dataclass(frozen=True)
class CrossoverResult:
    """The sweep, per fabric whether any K > 0 beats K = 0 by the planner's margin, and the
    design note's break-even touch count against the hottest rows' expected touches."""

    world_size: int
    rows: tuple[CrossoverRow, ...]
    replication_pays: Mapping[str, bool]
    best_hot_rows: Mapping[str, int]
    break_even_touches: float
    rows_above_break_even: int
    fused: bool
    label: str = "simulated"


def _k_grid(total_rows: int) -> list[int]:
    ks = {0, total_rows}
    k = 1
    while k < total_rows:
        ks.add(k)
        k *= 4
    return sorted(ks)


def crossover(config: SimulationConfig | None = None, *, world_size: int = 8,
              hot_row_counts: Sequence[int] | None = None, min_gain: float = 0.01,
              fabrics: Sequence[str] = ("flat", "two-level"),
              fuse_allreduce: bool = True) -> CrossoverResult:
    """Hybrid's modelled time against K, the number of hottest rows replicated, on the
    flat fabric (`flat_cluster`) and the preset's two-level one, memory budget ignored.

    With ``fuse_allreduce`` (default) the hot rows ride in the dense gradients' all-reduce
    (Sec. 2.5.4), so the sweep weighs the bytes replication saves against the bytes it
    adds; without it, a separate hot all-reduce also pays its own ``2(W-1)`` latency
    steps, which at GPU-cluster latencies outweighs the small all-to-all of a one-hot
    batch by itself. Nothing is overlapped.

    ``replication_pays[fabric]``: the best K > 0 is faster than K = 0 by more than
    ``min_gain`` (the planner's margin). ``rows_above_break_even``: rows whose expected
    remote touches ``(W-1)(1-(1-p)^(B_l n))`` exceed `break_even_touches`, the rows that
    replication pays for on the flat fabric by bytes alone.
    """
    config = config or SimulationConfig()
    unknown = [f for f in fabrics if f not in ("flat", "two-level")]
    if unknown or not fabrics:
        raise PlanError("fabrics", f"must be among 'flat', 'two-level', got {list(fabrics)!r}")
    if not (isinstance(world_size, int) and world_size >= 2):
        raise PlanError("world_size", f"must be an int >= 2, got {world_size!r}")
    topology = config.topology()
    table_rows = config.table_rows()
    total = sum(table_rows)
    ks = sorted(set(hot_row_counts)) if hot_row_counts is not None else _k_grid(total)
    if not ks or ks[0] < 0 or ks[-1] > total:
        raise PlanError("hot_row_counts", f"must be in 0..{total}, got {ks!r}")
    if ks[0] != 0:
        ks = [0, *ks]
    probabilities = SyntheticClickLog(config.data_config()).probabilities()
    order = ranked_rows(probabilities)
    compute_s = config.compute_seconds()
    dense_params = config.dense_param_count()
    per_row = hot_row_bytes(config.embedding_dim, config.optimizer, config.element_bytes)
    rows: list[CrossoverRow] = []
    pays: dict[str, bool] = {}
    best_k: dict[str, int] = {}
    for fabric in fabrics:
        cluster = (flat_cluster(topology, world_size) if fabric == "flat"
                   else ClusterModel.from_topology(topology, world_size))
        times = {}
        for k in ks:
            plan = make_plan("hybrid", table_rows=table_rows, world_size=world_size,
                             hot_rows=tuple(int(g) for g in order[:k]))
            model = _model(
                probabilities, "hybrid", plan, cluster,
                batch_size_per_rank=config.batch_size_per_rank,
                embedding_dim=config.embedding_dim, bag_size=config.bag_size,
                element_bytes=config.element_bytes, id_bytes=config.id_bytes,
                dense_param_count=dense_params, compute_s=compute_s,
                touched_counts=config.touched_counts, overlap=False,
                fuse_allreduce=fuse_allreduce)
            a2a = float(np.max(np.sum([np.asarray(model.phase_bytes[p], dtype=np.float64)
                                       for p in ALL_TO_ALL_PHASES if p in model.phase_bytes]
                                      or [np.zeros(world_size)], axis=0)))
            # the hot rows' share of the all-reduce, fused or not: the ring's 2(W-1)/W
            hot = (k * config.embedding_dim + (k if config.touched_counts else 0)) \
                * config.element_bytes
            times[k] = model.seconds
            rows.append(CrossoverRow(fabric, k, model.seconds, a2a,
                                     2.0 * (world_size - 1) / world_size * hot, k * per_row))
        best = min(ks, key=lambda k: (times[k], k))
        best_k[fabric] = best
        pays[fabric] = best > 0 and times[best] < times[0] * (1.0 - min_gain)
    draws = config.batch_size_per_rank * config.bag_size
    touches = (world_size - 1) * -np.expm1(draws * np.log1p(-np.minimum(probabilities, 1.0)))
    threshold = break_even_touches(world_size, config.embedding_dim, config.element_bytes,
                                   config.id_bytes)
    return CrossoverResult(world_size, tuple(rows), pays, best_k, threshold,
                           int(np.count_nonzero(touches > threshold)), fuse_allreduce)


# --------------------------------------------------------------------------- validation


def _relative_error(measured: float, predicted: float) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return abs(predicted - measured) / abs(measured)


@dataclass(frozen=True)
class BytesValidation:
    """Measured (or sampled exact) bytes against the model's expectation, per phase.

    ``rows``: (phase, measured busiest, predicted busiest, measured total, predicted total,
    relative error of the busiest rank, of the total). Totals are NaN when only busiest-rank
    figures were measured. ``passed``: every relative error within ``tolerance``.
    """

    rows: tuple[tuple[str, float, float, float, float, float, float], ...]
    tolerance: float
    passed: bool

    @property
    def max_relative_error(self) -> float:
        errors = [e for r in self.rows for e in r[5:] if not math.isnan(e)]
        return max(errors, default=0.0)


def validate_bytes(measured: Mapping[Any, float], predicted: Mapping[str, Any], *,
                   tolerance: float = 0.03) -> BytesValidation:
    """Compare measured bytes with `perfmodel.expected_phase_bytes`.

    ``measured``: either ``{(phase, rank): bytes}`` (the `CommLog`'s or
    `accounting.exact_bytes`' layout, possibly averaged over iterations) or
    ``{phase: busiest-rank bytes}``. ``predicted``: ``{phase: bytes per rank [W]}`` or
    ``{phase: busiest-rank bytes}``. Phases missing on one side count as 0 bytes there.
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise PlanError("tolerance", f"must be >= 0, got {tolerance!r}")
    per_rank: dict[str, dict[int, float]] = {}
    busiest_only: dict[str, float] = {}
    for key, value in measured.items():
        if isinstance(key, tuple):
            phase, rank = key
            per_rank.setdefault(str(phase), {})[int(rank)] = float(value)
        else:
            busiest_only[str(key)] = float(value)
    if per_rank and busiest_only:
        raise PlanError("measured", "must be keyed all by (phase, rank) or all by phase")
    phases = sorted(set(per_rank) | set(busiest_only) | set(predicted),
                    key=lambda p: (_PHASE_ORDER.get(p, len(_PHASE_ORDER)), p))
    rows = []
    for phase in phases:
        pred = np.atleast_1d(np.asarray(predicted.get(phase, 0.0), dtype=np.float64))
        pred_busiest = float(pred.max()) if pred.size else 0.0
        pred_total = float(pred.sum()) if pred.size > 1 else math.nan
        if per_rank:
            ranks = per_rank.get(phase, {})
            meas_busiest = max(ranks.values(), default=0.0)
            meas_total = float(sum(ranks.values()))
        else:
            meas_busiest = busiest_only.get(phase, 0.0)
            meas_total = math.nan
        err_busiest = _relative_error(meas_busiest, pred_busiest)
        err_total = (math.nan if math.isnan(meas_total) or math.isnan(pred_total)
                     else _relative_error(meas_total, pred_total))
        rows.append((phase, meas_busiest, pred_busiest, meas_total, pred_total, err_busiest,
                     err_total))
    passed = all(e <= tolerance for r in rows for e in r[5:] if not math.isnan(e))
    return BytesValidation(tuple(rows), float(tolerance), passed)


_PHASE_ORDER = {p: i for i, p in enumerate((*ALL_TO_ALL_PHASES, *ALL_REDUCE_PHASES))}


@dataclass(frozen=True)
class TimeValidation:
    """Emulated wall-clock seconds against modelled seconds, per scheme.

    ``rows``: (scheme, measured s, modelled s, measured / modelled). ``within_tolerance``:
    every ratio in ``[1/ratio_tolerance, ratio_tolerance]``. ``ordering_agrees``: every
    pair of schemes whose modelled times differ by more than ``tie_fraction`` is ordered
    the same way by the measurements. ``passed``: both.
    """

    rows: tuple[tuple[str, float, float, float], ...]
    ratio_tolerance: float
    tie_fraction: float
    within_tolerance: bool
    ordering_agrees: bool
    disagreements: tuple[tuple[str, str], ...] = field(default=())

    @property
    def passed(self) -> bool:
        return self.within_tolerance and self.ordering_agrees


def validate_times(measured: Mapping[str, float], modelled: Mapping[str, float], *,
                   ratio_tolerance: float = 1.5, tie_fraction: float = 0.05) -> TimeValidation:
    """Compare measured seconds per scheme (emulated runs at 4-8 ranks) with the model's
    seconds for the emulated link (`model_schemes` on `ClusterModel.from_topology` of the
    emulated topology). Only schemes on both sides are compared."""
    if not (isinstance(ratio_tolerance, (int, float)) and ratio_tolerance >= 1):
        raise PlanError("ratio_tolerance", f"must be >= 1, got {ratio_tolerance!r}")
    if not (isinstance(tie_fraction, (int, float)) and 0 <= tie_fraction < 1):
        raise PlanError("tie_fraction", f"must be in [0, 1), got {tie_fraction!r}")
    schemes = [s for s in modelled if s in measured]
    if not schemes:
        raise PlanError("measured", "names no scheme that was modelled")
    for s in schemes:
        for side, value in (("measured", measured[s]), ("modelled", modelled[s])):
            if not (math.isfinite(value) and value > 0):
                raise PlanError(side, f"{s}: seconds must be finite and > 0, got {value!r}")
    rows = tuple((s, float(measured[s]), float(modelled[s]), measured[s] / modelled[s])
                 for s in schemes)
    within = all(1.0 / ratio_tolerance <= r[3] <= ratio_tolerance for r in rows)
    disagreements = []
    for i, a in enumerate(schemes):
        for b in schemes[i + 1:]:
            ma, mb = modelled[a], modelled[b]
            if abs(ma - mb) <= tie_fraction * max(ma, mb):
                continue  # a modelled near-tie says nothing about the order
            if (ma < mb) != (measured[a] < measured[b]):
                disagreements.append((a, b))
    return TimeValidation(rows, float(ratio_tolerance), float(tie_fraction), within,
                          not disagreements, tuple(disagreements))


# --------------------------------------------------------------------------- tables


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _mib(num_bytes: float) -> float:
    return round(num_bytes / 2**20, 4)


def scaling_table(study: ScalingStudy) -> Table:
    """Iteration time per scheme and world size, the hot set and the speedups."""
    columns = ["W", "nodes", *(f"{s} ms" for s in SCENARIOS), "K", "K scheduled",
               "hot MiB/rank scheduled", "x table_pooled", "x row_dedup"]
    rows = [[r.world_size, r.num_nodes, *(_ms(r.seconds[s]) for s in SCENARIOS), r.hot_rows,
             r.scheduled_hot_rows, _mib(r.scheduled_hot_memory_bytes_per_rank),
             round(r.speedup_vs_table_pooled, 3), round(r.speedup_vs_row_dedup, 3)]
            for r in study.rows]
    cfg = study.config
    low, high = PAPER_SPEEDUP_RANGE
    note = (f"simulated, not measured. Speedups are hybrid_scheduled over each baseline "
            f"(baselines unscheduled). The poster reports {low}-{high}x at 32 GPUs on real "
            f"data against unnamed baselines, not comparable. Assumptions: "
            + "; ".join(f"{k}: {v}" for k, v in study.assumptions.items()))
    return Table(f"Simulated iteration time, s={cfg.zipf_exponent:g}, D={cfg.embedding_dim}, "
                 f"{cfg.preset}", columns, rows, "simulated", note)


def scaling_bytes_table(study: ScalingStudy,
                        scenarios: Sequence[str] = ("table_pooled", "row", "row_dedup",
                                                    "hybrid")) -> Table:
    """The busiest rank's expected MiB per phase, per scheme and world size."""
    phases = [p for p in (*ALL_TO_ALL_PHASES, *ALL_REDUCE_PHASES)
              if any(p in r.busiest_bytes[s] for r in study.rows for s in scenarios)]
    columns = ["W", "scheme", *(f"{p} MiB" for p in phases)]
    rows = [[r.world_size, s, *(_mib(r.busiest_bytes[s].get(p, 0.0)) for p in phases)]
            for r in study.rows for s in scenarios]
    return Table("Simulated busiest-rank bytes per iteration", columns, rows, "simulated",
                 "expected bytes (perfmodel.expected_phase_bytes), per phase the most any "
                 "one rank sends")


def crossover_table(result: CrossoverResult) -> Table:
    columns = ["fabric", "K", "ms", "a2a MiB", "hot all-reduce MiB", "hot MiB/rank"]
    rows = [[r.fabric, r.hot_rows, _ms(r.seconds), _mib(r.all_to_all_bytes),
             _mib(r.hot_allreduce_bytes), _mib(r.memory_bytes_per_rank)] for r in result.rows]
    pays = ", ".join(f"{f}: {'pays' if p else 'loses'} (best K={result.best_hot_rows[f]})"
                     for f, p in result.replication_pays.items())
    allreduce = "fused into the dense all-reduce" if result.fused else "a separate all-reduce"
    note = (f"hybrid at W={result.world_size}, hot rows in {allreduce}, no overlap; "
            f"replication {pays}. On a flat "
            f"fabric a row saves bytes only if more than {result.break_even_touches:.2f} "
            f"remote ranks touch it per iteration: {result.rows_above_break_even} rows do.")
    return Table(f"Simulated replication crossover, W={result.world_size}", columns, rows,
                 "simulated", note)


def bytes_validation_table(validation: BytesValidation, *, kind: Kind = "measured",
                           title: str = "Measured bytes against the model") -> Table:
    """``kind`` labels the measured side (the model's columns are its expectation)."""
    columns = ["phase", "measured busiest", "modelled busiest", "measured total",
               "modelled total", "rel err busiest", "rel err total"]
    rows = [[p, round(mb, 1), round(pb, 1), round(mt, 1), round(pt, 1), round(eb, 5),
             round(et, 5)] for p, mb, pb, mt, pt, eb, et in validation.rows]
    verdict = "pass" if validation.passed else "FAIL"
    return Table(title, columns, rows, kind,
                 f"{verdict} at {validation.tolerance:.1%} relative error; modelled = "
                 "perfmodel.expected_phase_bytes (closed-form expectation)")


def time_validation_table(validation: TimeValidation, *, kind: Kind = "emulated",
                          title: str = "Emulated time against the model") -> Table:
    columns = ["scheme", "measured ms", "modelled ms", "measured / modelled"]
    rows = [[s, _ms(m), _ms(p), round(r, 3)] for s, m, p, r in validation.rows]
    verdict = "pass" if validation.passed else "FAIL"
    order = ("ordering agrees" if validation.ordering_agrees else
             "ordering disagrees on " + ", ".join(f"{a}/{b}" for a, b in
                                                  validation.disagreements))
    return Table(title, columns, rows, kind,
                 f"{verdict}: ratios within {validation.ratio_tolerance:g}x: "
                 f"{validation.within_tolerance}; {order} (modelled ties within "
                 f"{validation.tie_fraction:.0%} ignored); modelled = simulated")

