"""The benchmark harness of pattern-aware sparse communication for DLRM training (He, Chen,
Zhai, PPoPP '24 poster; design note `recsys.md` Sec. 7 "Benchmarks", Sec. 4 for TorchRec).

`run_bench` trains every scheme of `config.SCHEMES` (plus hybrid with every scheduling
technique on, and TorchRec's table-wise DLRM when it is installed) on the same batches in
one spawn of ``world_size`` gloo ranks, timing them step by step in interleaved rounds
(`runtime.timing.round_robin`: every round runs each scheme one step, in a rotating order),
so a change in how busy the host is hits every scheme alike and ratios can be paired.

Times are wall-clock on this host with the network EMULATED (`runtime.netem`, sleep mode:
one link class of ``bandwidth_Bps`` and ``latency_s``, or, with ``ranks_per_node``, that link
between nodes and a faster one inside) for our engine's phases; they are labelled so. Bytes
are the CommLog's, and the busiest rank's bytes across nodes are attributed by
`runtime.twolevel.LevelCounter` as the emulator times them. TorchRec calls
``torch.distributed`` itself, so its traffic is not emulated
(real loopback gloo) and its bytes are INTERCEPTED, not logged: it is shown for reference,
not as a speed ratio. The hybrid scheme's hot set comes from `plan.choose_hot_set` over the
profiled access counts of the first batches and the emulated machine's `ClusterModel`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .config import (
    SCHEMES,
    SPARSE_OPTIMIZERS,
    DataConfig,
    EngineConfig,
    ModelConfig,
    OptimizerConfig,
    PlanError,
    ShardingPlan,
    scaled_table_rows,
)

__all__ = ["SCHEDULED", "SCHEDULED_BASELINE", "BenchConfig", "BenchResult", "SchemeResult",
           "run_bench"]

EXCLUDED_GROUPS = ("metrics", "gather")  # bookkeeping, not training traffic
PROFILE_BATCHES = 4
SCHEDULED = "hybrid_scheduled"
# row_dedup with the same scheduling as SCHEDULED (hybrid with K = 0): what the scheduling
# alone buys, so that the planned scheme's gain can be split into scheduling and replication
SCHEDULED_BASELINE = "row_dedup_scheduled"
TORCHREC = "torchrec_tw"


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run.

    Attributes:
        world_size: gloo ranks.
        schemes: engine schemes to run (hybrid also runs with `EngineConfig.scheduled`).
        steps, warmup: timed and untimed rounds per repeat; ``repeats`` repeats the timed
            rounds, so every scheme trains ``warmup + steps * repeats`` steps on the same
            batches and has ``steps * repeats`` timing samples.
        batch_size: the GLOBAL batch.
        row_scale: Criteo's table sizes times this (`config.scaled_table_rows`).
        bandwidth_Bps, latency_s: the emulated link (between nodes, when ``ranks_per_node``
            makes two levels); ``bandwidth_Bps=None`` runs plain loopback gloo (and the
            planner assumes a nominal 1 GB/s link).
        ranks_per_node: ranks that share a node: with 1 < ranks_per_node < world_size the
            machine has two levels, ranks of one node talk over ``intra_bandwidth_Bps`` and
            ``intra_latency_s``, and the engine's all-reduces are hierarchical.
        hot_budget_mib: the planner's per-rank memory for replicated rows.
        torchrec: also run TorchRec's table-wise DLRM when it is installed.
    """

    world_size: int = 4
    schemes: tuple[str, ...] = SCHEMES
    steps: int = 8
    warmup: int = 2
    batch_size: int = 1024
    row_scale: float = 1e-3
    zipf_exponent: float = 1.05
    bag_size: int = 1
    embedding_dim: int = 16
    interaction: str = "dot"
    optimizer: str = "rowwise_adagrad"
    hot_budget_mib: float = 8.0
    bandwidth_Bps: float | None = 1e9
    latency_s: float = 5e-5
    ranks_per_node: int = 1
    intra_bandwidth_Bps: float = 1e10
    intra_latency_s: float = 1e-5
    torchrec: bool = True
    repeats: int = 3
    seed: int = 0
    table_rows: tuple[int, ...] | None = None  # overrides row_scale (tests: tiny tables)
    # forces the hybrid hot set to the this many hottest profiled rows instead of the
    # planner's choice: the check that a declined replication was right
    hot_rows: int | None = None

    def __post_init__(self) -> None:
        for name in ("world_size", "steps", "batch_size", "bag_size", "embedding_dim",
                     "repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(name, f"must be an integer >= 1, got {value!r}")
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise PlanError("warmup", f"must be an integer >= 0, got {self.warmup!r}")
        if not self.schemes or len(set(self.schemes)) != len(self.schemes) or any(
                s not in SCHEMES for s in self.schemes):
            raise PlanError("schemes", f"must be distinct names from {', '.join(SCHEMES)}, "
                            f"got {self.schemes!r}")
        if self.batch_size % self.world_size:
            raise PlanError("batch_size", f"must be a multiple of world_size="
                            f"{self.world_size}, got {self.batch_size}")
        if not (isinstance(self.row_scale, (int, float)) and 0 < self.row_scale <= 1):
            raise PlanError("row_scale", f"must be in (0, 1], got {self.row_scale!r}")
        if not (isinstance(self.zipf_exponent, (int, float)) and 0 <= self.zipf_exponent <= 4):
            raise PlanError("zipf_exponent", f"must be in [0, 4], got {self.zipf_exponent!r}")
        if self.interaction not in ("dot", "dcn"):
            raise PlanError("interaction", f"must be 'dot' or 'dcn', got {self.interaction!r}")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise PlanError("optimizer", f"must be one of {', '.join(SPARSE_OPTIMIZERS)}, "
                            f"got {self.optimizer!r}")
        if not (isinstance(self.hot_budget_mib, (int, float)) and self.hot_budget_mib >= 0
                and math.isfinite(self.hot_budget_mib)):
            raise PlanError("hot_budget_mib", f"must be a finite number >= 0, "
                            f"got {self.hot_budget_mib!r}")
        if self.bandwidth_Bps is not None and not (
                isinstance(self.bandwidth_Bps, (int, float)) and math.isfinite(self.bandwidth_Bps)
                and self.bandwidth_Bps > 0):
            raise PlanError("bandwidth_Bps", f"must be > 0 bytes/s or None (no emulation), "
                            f"got {self.bandwidth_Bps!r}")
        if not (isinstance(self.latency_s, (int, float)) and math.isfinite(self.latency_s)
                and self.latency_s >= 0):
            raise PlanError("latency_s", f"must be >= 0 seconds, got {self.latency_s!r}")
        if not (isinstance(self.ranks_per_node, int) and not isinstance(self.ranks_per_node, bool)
                and 1 <= self.ranks_per_node <= self.world_size
                and self.world_size % self.ranks_per_node == 0):
            raise PlanError("ranks_per_node", f"must be an integer that divides world_size="
                            f"{self.world_size}, got {self.ranks_per_node!r}")
        for name in ("intra_bandwidth_Bps", "intra_latency_s"):
            value = getattr(self, name)
            low_ok = value > 0 if name == "intra_bandwidth_Bps" else value >= 0
            if not (isinstance(value, (int, float)) and math.isfinite(value) and low_ok):
                raise PlanError(name, f"must be a finite number "
                                f"{'> 0' if name == 'intra_bandwidth_Bps' else '>= 0'}, "
                                f"got {value!r}")
        if self.table_rows is not None:
            DataConfig(table_rows=self.table_rows)  # raises DataError naming table_rows
        if self.hot_rows is not None and not (isinstance(self.hot_rows, int)
                                              and self.hot_rows >= 0):
            raise PlanError("hot_rows", f"must be an integer >= 0, got {self.hot_rows!r}")

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps * self.repeats

    def data(self) -> DataConfig:
        rows = self.table_rows or scaled_table_rows(self.row_scale)
        return DataConfig(table_rows=rows, zipf_exponent=self.zipf_exponent,
                          bag_size=self.bag_size, seed=self.seed)

    def model(self) -> ModelConfig:
        d = self.embedding_dim
        return ModelConfig(embedding_dim=d, bottom_mlp=(64, d), top_mlp=(64, 1),
                           interaction=self.interaction)

    def optim(self) -> OptimizerConfig:
        return OptimizerConfig(sparse=self.optimizer)

    @property
    def two_level(self) -> bool:
        from furnace.runtime.twolevel import is_two_level

        return is_two_level(self.ranks_per_node, self.world_size)

    def topology(self) -> Any:
        """The emulated machine (the planner's too; a nominal 1 GB/s link without one)."""
        from furnace.runtime.presets import emulated_link

        two = dict(ranks_per_node=self.ranks_per_node, intra_bandwidth_Bps=self.intra_bandwidth_Bps,
                   intra_latency_s=self.intra_latency_s) if self.two_level else {}
        return emulated_link(bandwidth_Bps=self.bandwidth_Bps or 1e9, latency_s=self.latency_s,
                             **two)  # type: ignore[arg-type]

    @property
    def network_label(self) -> str:
        if self.bandwidth_Bps is None:
            return "no emulation (loopback gloo)"
        link = f"{self.bandwidth_Bps / 1e6:g} MB/s, {self.latency_s * 1e6:g} us"
        if not self.two_level:
            return f"emulated {link}"
        return (f"emulated {self.world_size // self.ranks_per_node} nodes x "
                f"{self.ranks_per_node}: {link} between nodes, "
                f"{self.intra_bandwidth_Bps / 1e6:g} MB/s, {self.intra_latency_s * 1e6:g} us "
                f"inside")


@dataclass
class SchemeResult:
    """One scheme's measurements. Bytes are per step; ``bytes_by_phase`` is, per phase, the
    busiest rank's; ``bytes_per_rank`` the totals over all steps by "phase/rank"."""

    name: str
    engine: str
    samples_s: list[float]
    bytes_by_phase: dict[str, float]
    busiest_bytes_per_step: float
    total_bytes_per_step: float
    bytes_per_rank: dict[str, int]
    hot_rows: int
    final_loss: float
    losses: list[float]
    plan: ShardingPlan | None = None
    intercepted: dict[str, Any] | None = None
    note: str = ""
    # per step, the most bytes any one rank sends across nodes (all of them on a flat link)
    busiest_inter_node_bytes_per_step: float = 0.0

    @property
    def median_s(self) -> float:
        s = sorted(self.samples_s)
        n = len(s)
        return float(s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


@dataclass
class BenchResult:
    config: BenchConfig
    schemes: list[SchemeResult]
    notes: list[str] = field(default_factory=list)
    hot_reason: str = ""

    def scheme(self, name: str) -> SchemeResult:
        for s in self.schemes:
            if s.name == name:
                return s
        raise KeyError(name)

    def speedups(self, baseline: str) -> dict[str, float]:
        """Median over rounds of baseline time / scheme time (paired within a round)."""
        from furnace.runtime.timing import median_paired_ratio
        names = [s.name for s in self.schemes]
        if baseline not in names:
            return {}
        base = self.scheme(baseline).samples_s
        return {s.name: median_paired_ratio(base, s.samples_s) for s in self.schemes
                if s.name != TORCHREC}

    def to_dict(self) -> dict[str, Any]:
        schemes = []
        for s in self.schemes:
            d = asdict(s)
            d["plan"] = None if s.plan is None else {"sharding": s.plan.sharding,
                                                     "hot_rows": len(s.plan.hot_rows)}
            d["median_s"] = s.median_s
            schemes.append(d)
        return {"config": asdict(self.config), "network": self.config.network_label,
                "schemes": schemes, "notes": list(self.notes), "hot_reason": self.hot_reason,
                "speedup_vs_row_dedup": self.speedups("row_dedup"),
                "speedup_vs_table_pooled": self.speedups("table_pooled")}

    def print(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.table import Table
        console = console or Console(width=150)
        c = self.config
        table = Table(title=f"DLRM schemes, {c.world_size} gloo ranks, global batch "
                      f"{c.batch_size}, {c.network_label} (wall-clock, emulated network)")
        for name in ("scheme", "ms/step", "x row_dedup", "x table_pooled", "K hot",
                     "busiest KB/step", "across nodes KB/step",
                     "by phase (busiest rank, KB/step)", "final loss"):
            table.add_column(name)
        vs_dedup, vs_table = self.speedups("row_dedup"), self.speedups("table_pooled")
        for s in self.schemes:
            phases = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in sorted(s.bytes_by_phase.items()))
            if s.intercepted is not None:
                phases = "intercepted: " + phases
            table.add_row(s.name, f"{s.median_s * 1e3:.2f}",
                          f"{vs_dedup[s.name]:.3f}" if s.name in vs_dedup else "-",
                          f"{vs_table[s.name]:.3f}" if s.name in vs_table else "-",
                          str(s.hot_rows), f"{s.busiest_bytes_per_step / 1e3:.1f}",
                          ("-" if s.intercepted is not None
                           else f"{s.busiest_inter_node_bytes_per_step / 1e3:.1f}"), phases,
                          f"{s.final_loss:.4f}")
        console.print(table)
        if self.hot_reason:
            console.print(f"hot set: {self.hot_reason}")
        for note in self.notes:
            console.print(note)


def _plans(config: BenchConfig, data: DataConfig, model: ModelConfig,
           dense_params: int, touched: bool) -> tuple[dict[str, ShardingPlan], str]:
    from .data import SyntheticClickLog, access_counts
    from .perfmodel import ClusterModel
    from .plan import choose_hot_set, make_plan, profile_probabilities, ranked_rows
    w = config.world_size
    plans = {s: make_plan(s, table_rows=data.table_rows, world_size=w)
             for s in config.schemes if s != "hybrid"}
    reason = ""
    if "hybrid" in config.schemes:
        log = SyntheticClickLog(data)
        counts = access_counts(log.batches(config.batch_size, PROFILE_BATCHES), data.table_rows)
        base = make_plan("row", table_rows=data.table_rows, world_size=w)
        probabilities = profile_probabilities(counts, data.table_rows)
        if config.hot_rows is not None:
            forced = ranked_rows(probabilities)[:config.hot_rows]
            plans["hybrid"] = make_plan("hybrid", table_rows=data.table_rows, world_size=w,
                                        hot_rows=tuple(int(g) for g in forced))
            return plans, f"forced: the {len(forced)} hottest profiled rows"
        choice = choose_hot_set(
            probabilities, plan_base=base,
            batch_size_per_rank=config.batch_size // w, embedding_dim=model.embedding_dim,
            cluster=ClusterModel.from_topology(config.topology(), w),
            memory_budget_bytes=config.hot_budget_mib * 2**20, optimizer=config.optimizer,
            bag_size=config.bag_size, element_bytes=4, dense_param_count=dense_params,
            touched_counts=touched, fuse_allreduce=True, overlap=True)
        plans["hybrid"] = make_plan("hybrid", table_rows=data.table_rows, world_size=w,
                                    hot_rows=choice.hot_rows)
        reason = choice.reason
    return plans, reason


def _worker(rank: int, world_size: int, config: BenchConfig) -> dict[str, Any]:
    from furnace.runtime.comm import CommLog
    from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
    from furnace.runtime.timing import round_robin
    from furnace.runtime.twolevel import LevelCounter

    from .data import SyntheticClickLog
    from .engine import ShardedTrainer, needs_touched_counts
    from .model import dense_parameter_count
    from .torchrec_baseline import TorchRecTrainer, available

    data, model, optim = config.data(), config.model(), config.optim()
    dense_params = dense_parameter_count(model, data.num_dense, data.num_tables)
    plans, reason = _plans(config, data, model, dense_params, needs_touched_counts(optim))
    batches = list(SyntheticClickLog(data).batches(config.batch_size, config.total_steps))

    def network() -> Any:
        if config.bandwidth_Bps is None:
            return None
        return NetworkEmulator(NetworkEmulation(topology=config.topology(), mode="sleep"))

    trainers: dict[str, Any] = {}
    counters: dict[str, LevelCounter] = {}
    engines: dict[str, EngineConfig] = {}
    for scheme in config.schemes:
        engines[scheme] = EngineConfig(scheme=scheme)
        if scheme == "hybrid":
            # no pairwise rounds: they pay W-1 latencies for one exchange, which loses on a
            # latency-bound link (FasterMoE's trade-off); the engine tests cover them
            engines[SCHEDULED] = EngineConfig("hybrid", prefetch=True, overlap=True,
                                              fuse_allreduce=True)
    if "hybrid" in config.schemes and "row_dedup" in config.schemes:
        engines[SCHEDULED_BASELINE] = EngineConfig("row_dedup", prefetch=True, overlap=True,
                                                   fuse_allreduce=True)
    for name, engine in engines.items():
        counters[name] = LevelCounter(config.topology(), by="group")
        trainers[name] = ShardedTrainer(data, model, optim, plans[engine.scheme], engine,
                                        seed=config.seed, dtype=torch.float32,
                                        network=network(), log=CommLog(),
                                        ranks_per_node=config.ranks_per_node,
                                        on_traffic=counters[name])
    notes = []
    ok, message = available()
    if config.torchrec and ok:
        trainers[TORCHREC] = TorchRecTrainer(data, model, optim, seed=config.seed,
                                             world_size=world_size)
        notes.append("TorchRec TW: real loopback gloo (not emulated), bytes intercepted from "
                     "torch.distributed; not comparable as a speed ratio")
    elif config.torchrec:
        notes.append(f"TorchRec skipped: {message}")

    done = dict.fromkeys(trainers, 0)
    losses: dict[str, list[float]] = {name: [] for name in trainers}

    def one_step(name: str) -> float:
        i = done[name]
        trainer = trainers[name]
        dist.barrier()  # every rank starts the step together
        start = time.perf_counter()
        if name in engines and engines[name].prefetch:
            upcoming = batches[i + 1] if i + 1 < len(batches) else None
            loss = trainer.step(batches[i], upcoming)
        else:
            loss = trainer.step(batches[i])
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        done[name] = i + 1
        losses[name].append(loss)
        return float(elapsed)

    samples = round_robin(list(trainers), one_step, rounds=config.steps * config.repeats,
                          warmup=config.warmup)
    logged: dict[str, dict[str, int]] = {}
    for name, trainer in trainers.items():
        per: dict[str, int] = defaultdict(int)
        if name == TORCHREC:
            for op, b in trainer.counts.bytes_sent.items():
                per[f"{op}/{rank}"] += int(b)
        else:
            for rec in trainer.comm_log.records:
                if rec.group not in EXCLUDED_GROUPS:
                    per[f"{rec.group}/{rank}"] += int(rec.bytes_sent)
        logged[name] = dict(per)
    # the counters watch only the training phases' communicators, not metrics or gather
    inter = {name: sum(levels.get(lvl, 0) for levels in counter.bytes.values()
                       for lvl in ("inter_node", "inter_group"))
             for name, counter in counters.items()}
    return {"samples": samples, "bytes": logged, "inter": inter, "losses": losses,
            "notes": notes,
            "reason": reason, "plans": plans,
            "engines": {n: e.scheme + (" scheduled" if e.prefetch else "")
                        for n, e in engines.items()},
            "plan_of": {n: e.scheme for n, e in engines.items()},
            "intercepted": ({TORCHREC: trainers[TORCHREC].counts.to_dict()}
                            if TORCHREC in trainers else {})}


def run_bench(config: BenchConfig, *, timeout_s: float = 600.0) -> BenchResult:
    """Run every scheme in one spawn of ``config.world_size`` gloo ranks (see module doc)."""
    from furnace.runtime.launch import run_distributed
    per_rank = run_distributed(_worker, config.world_size, config, timeout_s=timeout_s)
    first = per_rank[0]
    steps = config.total_steps
    results = []
    for name, samples in first["samples"].items():
        merged: dict[str, int] = {}
        for r in per_rank:
            merged.update(r["bytes"][name])
        by_phase: dict[str, float] = defaultdict(float)
        per_rank_total: dict[str, int] = defaultdict(int)
        for key, b in merged.items():
            phase, rank = key.rsplit("/", 1)
            by_phase[phase] = max(by_phase[phase], b / steps)
            per_rank_total[rank] += b
        plan = first["plans"].get(first["plan_of"].get(name, name))
        results.append(SchemeResult(
            name=name, engine=first["engines"].get(name, "torchrec table-wise"),
            samples_s=list(samples), bytes_by_phase=dict(by_phase),
            busiest_bytes_per_step=max(per_rank_total.values(), default=0) / steps,
            total_bytes_per_step=sum(merged.values()) / steps, bytes_per_rank=merged,
            hot_rows=len(plan.hot_rows) if plan is not None else 0,
            final_loss=first["losses"][name][-1], losses=first["losses"][name], plan=plan,
            intercepted=first["intercepted"].get(name),
            busiest_inter_node_bytes_per_step=max(
                (r["inter"].get(name, 0) for r in per_rank), default=0) / steps))
    return BenchResult(config=config, schemes=results, notes=first["notes"],
                       hot_reason=first["reason"])
