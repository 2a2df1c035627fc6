"""Every scheme's modelled traffic and time on one cluster, and the hot set the performance
model picks: what `furnace recsys plan` prints (design note `recsys.md` Sec. 2.4, a
reconstruction; every figure here is modelled, closed form, nothing runs).

`plan_problem` builds the planner's inputs from a few user-facing numbers (Criteo's tables
scaled, a Zipf skew, a cluster preset); `plan_report` runs the planner on them and models every
scheme with the chosen hot set, so a user sees what replication buys (or why it is declined)
before training anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import SCHEMES, DataConfig, ModelConfig, PlanError, scaled_table_rows
from .model import dense_parameter_count

__all__ = ["PlanProblem", "PlanReport", "SchemeModel", "plan_problem", "plan_report"]

# forward plus backward of the dense part, as multiples of its forward FLOPs (the backward
# computes the gradients of both the activations and the weights)
TRAIN_FLOPS_PER_FORWARD = 3.0


@dataclass(frozen=True)
class PlanProblem:
    """The planner's inputs for one cluster and data set."""

    data: DataConfig
    model: ModelConfig
    probabilities: np.ndarray
    cluster: Any
    world_size: int
    batch_size_per_rank: int
    optimizer: str
    memory_budget_bytes: float
    compute_s: float
    dense_param_count: int
    element_bytes: int = 4

    @property
    def embedding_dim(self) -> int:
        return self.model.embedding_dim


def plan_problem(*, world_size: int, ranks_per_node: int, preset: str = "h100-ib",
                 row_scale: float = 1e-3, zipf_exponent: float = 1.05, bag_size: int = 1,
                 batch_size_per_rank: int = 2048, embedding_dim: int = 16,
                 interaction: str = "dot", optimizer: str = "rowwise_adagrad",
                 memory_budget_bytes: float = 8 * 2**20, profile_batches: int = 0,
                 table_rows: tuple[int, ...] | None = None, topology: Any = None,
                 seed: int = 0) -> PlanProblem:
    """Criteo's tables times ``row_scale`` with Zipf(``zipf_exponent``) IDs on ``world_size``
    ranks of ``preset`` (or of ``topology``). The access probabilities are the generator's
    exact ones, or, with ``profile_batches > 0``, those counted on that many generated global
    batches (what `recsys train` plans from)."""
    from furnace.runtime.cost import roofline_time
    from furnace.runtime.presets import get_preset

    from .data import SyntheticClickLog, access_counts
    from .model import dense_flops
    from .perfmodel import ClusterModel
    from .plan import profile_probabilities

    if memory_budget_bytes < 0:
        raise PlanError("memory_budget", f"must be >= 0 bytes, got {memory_budget_bytes!r}")
    if table_rows is None:
        table_rows = scaled_table_rows(row_scale)
    data = DataConfig(table_rows=table_rows, zipf_exponent=zipf_exponent, bag_size=bag_size,
                      seed=seed)
    model = ModelConfig(embedding_dim=embedding_dim, bottom_mlp=(64, embedding_dim),
                        top_mlp=(64, 1), interaction=interaction)
    log = SyntheticClickLog(data)
    if profile_batches > 0:
        counts = access_counts(log.batches(batch_size_per_rank * world_size, profile_batches),
                               data.table_rows)
        probabilities = profile_probabilities(counts, data.table_rows)
    else:
        probabilities = log.probabilities()
    if topology is None:
        topology = get_preset(preset, gpus_per_node=ranks_per_node)
    flops = TRAIN_FLOPS_PER_FORWARD * dense_flops(model, data.num_dense, data.num_tables,
                                                  batch_size_per_rank)
    return PlanProblem(
        data=data, model=model, probabilities=probabilities,
        cluster=ClusterModel.from_topology(topology, world_size), world_size=world_size,
        batch_size_per_rank=batch_size_per_rank, optimizer=optimizer,
        memory_budget_bytes=memory_budget_bytes,
        compute_s=roofline_time(topology.device, flops),
        dense_param_count=dense_parameter_count(model, data.num_dense, data.num_tables))


def choose(problem: PlanProblem) -> Any:
    """The performance model's `HotSetChoice` for ``problem``."""
    from .plan import choose_hot_set, make_plan

    base = make_plan("hybrid", table_rows=problem.data.table_rows,
                     world_size=problem.world_size)
    return choose_hot_set(
        problem.probabilities, plan_base=base, batch_size_per_rank=problem.batch_size_per_rank,
        embedding_dim=problem.embedding_dim, cluster=problem.cluster,
        memory_budget_bytes=problem.memory_budget_bytes, optimizer=problem.optimizer,
        bag_size=problem.data.bag_size, element_bytes=problem.element_bytes,
        compute_s=problem.compute_s, dense_param_count=problem.dense_param_count,
        fuse_allreduce=True, overlap=True)


@dataclass(frozen=True)
class SchemeModel:
    """One scheme, modelled: expected bytes per phase sent by each rank, and time."""

    scheme: str
    hot_rows: int
    phase_bytes: dict[str, np.ndarray]
    seconds: float
    overlap: bool

    @property
    def busiest_rank_bytes(self) -> float:
        return float(np.sum(list(self.phase_bytes.values()), axis=0).max())


def model_scheme(problem: PlanProblem, scheme: str, hot_rows: tuple[int, ...] = (), *,
                 overlap: bool = False) -> SchemeModel:
    from .perfmodel import expected_phase_bytes, iteration_time
    from .plan import make_plan

    plan = make_plan(scheme, table_rows=problem.data.table_rows,
                     world_size=problem.world_size,
                     hot_rows=hot_rows if scheme == "hybrid" else ())
    phases = expected_phase_bytes(
        problem.probabilities, plan=plan, scheme=scheme,
        batch_size_per_rank=problem.batch_size_per_rank, embedding_dim=problem.embedding_dim,
        bag_size=problem.data.bag_size, element_bytes=problem.element_bytes,
        dense_param_count=problem.dense_param_count, fuse_allreduce=overlap)
    seconds = iteration_time(phases, problem.cluster, compute_s=problem.compute_s,
                             overlap=overlap)
    return SchemeModel(scheme, len(plan.hot_rows), phases, seconds, overlap)


@dataclass
class PlanReport:
    """The chosen hot set and every scheme modelled with it (labelled modelled)."""

    problem: PlanProblem
    choice: Any
    schemes: list[SchemeModel] = field(default_factory=list)

    def phases(self) -> list[str]:
        seen: list[str] = []
        for s in self.schemes:
            seen += [p for p in s.phase_bytes if p not in seen]
        return seen

    def print(self, console: Any) -> None:
        from rich.table import Table

        p = self.problem
        c = self.choice
        console.print(f"performance model (modelled): {p.world_size} ranks, "
                      f"{p.cluster.num_nodes} node(s) of {p.cluster.ranks_per_node}, "
                      f"{p.data.num_tables} tables / {p.data.total_rows:,} rows, Zipf "
                      f"{p.data.zipf_exponent:g}, {p.batch_size_per_rank} samples per rank, "
                      f"D={p.embedding_dim}")
        console.print(f"hot set: {c.size} rows, {c.memory_bytes_per_rank / 2**20:.2f} MiB per "
                      f"rank of a {p.memory_budget_bytes / 2**20:g} MiB budget; {c.reason}")
        phases = self.phases()
        table = Table(title="expected bytes per iteration on the busiest rank, KiB (modelled)")
        for col in ("scheme", "hot rows", *phases, "total", "time ms", "vs table_pooled"):
            table.add_column(col, justify="left" if col == "scheme" else "right")
        base = next((s.seconds for s in self.schemes if s.scheme == "table_pooled"), None)
        for s in self.schemes:
            per_phase = [f"{float(s.phase_bytes[ph].max()) / 1024:.1f}"
                         if ph in s.phase_bytes else "-" for ph in phases]
            name = s.scheme + (" (overlapped)" if s.overlap else "")
            speed = f"{base / s.seconds:.2f}x" if base else "-"
            table.add_row(name, str(s.hot_rows), *per_phase,
                          f"{s.busiest_rank_bytes / 1024:.1f}", f"{s.seconds * 1e3:.3f}", speed)
        console.print(table)

    def to_dict(self) -> dict[str, Any]:
        p = self.problem
        return {
            "label": "modelled",
            "world_size": p.world_size,
            "ranks_per_node": p.cluster.ranks_per_node,
            "zipf_exponent": p.data.zipf_exponent,
            "total_rows": p.data.total_rows,
            "hot_rows": self.choice.size,
            "hot_memory_bytes_per_rank": self.choice.memory_bytes_per_rank,
            "reason": self.choice.reason,
            "schemes": [{"scheme": s.scheme, "overlap": s.overlap, "hot_rows": s.hot_rows,
                         "seconds": s.seconds, "busiest_rank_bytes": s.busiest_rank_bytes,
                         "busiest_rank_bytes_by_phase": {
                             k: float(v.max()) for k, v in s.phase_bytes.items()}}
                        for s in self.schemes],
        }


def plan_report(**kwargs: Any) -> PlanReport:
    """`plan_problem(**kwargs)`, the planner's choice on it, and every scheme modelled (the
    hybrid scheme both plain and scheduled: overlapped behind compute, all-reduces fused)."""
    problem = plan_problem(**kwargs)
    choice = choose(problem)
    report = PlanReport(problem, choice)
    for scheme in SCHEMES:
        report.schemes.append(model_scheme(problem, scheme, choice.hot_rows))
    report.schemes.append(model_scheme(problem, "hybrid", choice.hot_rows, overlap=True))
    return report
