"""Sharding plans and the hot-set planner (design note `recsys.md` Sec. 2.3-2.4, a
reconstruction of the poster's performance-model-driven replication).

`make_plan` lays out a scheme: whole tables per rank (longest-processing-time assignment by
expected lookups, as TorchRec's greedy table-wise planner balances them) or rows round-robin.
`choose_hot_set` asks the performance model (`perfmodel`) how long an iteration takes with the
K most frequently accessed rows replicated, for K on a grid up to what the memory budget
allows, refines around the best, and keeps K = 0 unless replication beats the plain
deduplicated row-wise scheme. `brute_force_hot_set` scores every subset of rows on small
problems: the check that the top-K structure and the search find the optimum.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import PlanError, ShardingPlan

__all__ = ["HotSetChoice", "assign_tables", "brute_force_hot_set", "choose_hot_set",
           "hot_row_bytes", "make_plan", "objective", "profile_probabilities", "ranked_rows"]

# replication is kept only if it models at least this much faster than K = 0: a margin for
# the model's error, so that a near-tie does not buy memory and an all-reduce for nothing
MIN_GAIN = 0.01
BRUTE_FORCE_MAX_ROWS = 14


def assign_tables(table_rows: tuple[int, ...], world_size: int,
                  weights: tuple[float, ...] | None = None) -> tuple[int, ...]:
    """Owner of each table: heaviest table first onto the least-loaded rank (LPT). Weights
    default to the rows (memory); pass expected lookups to balance traffic instead."""
    load = weights if weights is not None else tuple(float(r) for r in table_rows)
    owners = [0] * len(table_rows)
    totals = [0.0] * world_size
    for t in sorted(range(len(table_rows)), key=lambda t: (-load[t], t)):
        rank = min(range(world_size), key=lambda r: (totals[r], r))
        owners[t] = rank
        totals[rank] += load[t]
    return tuple(owners)


def make_plan(scheme: str, *, table_rows: tuple[int, ...], world_size: int,
              hot_rows: tuple[int, ...] | Any = (),
              table_weights: tuple[float, ...] | None = None) -> ShardingPlan:
    """The `ShardingPlan` of ``scheme``: table sharding for table_pooled, row sharding
    otherwise; only hybrid replicates ``hot_rows``."""
    hot = tuple(sorted(int(g) for g in hot_rows))
    if hot and scheme != "hybrid":
        raise PlanError("hot_rows", f"only the hybrid scheme replicates rows, not {scheme}")
    if scheme == "table_pooled":
        # every table has the same number of lookups per sample, so balance by that
        weights = table_weights or tuple(1.0 for _ in table_rows)
        return ShardingPlan(world_size=world_size, table_rows=tuple(table_rows),
                            sharding="table",
                            table_owner=assign_tables(tuple(table_rows), world_size, weights))
    return ShardingPlan(world_size=world_size, table_rows=tuple(table_rows), sharding="row",
                        hot_rows=hot)


def profile_probabilities(counts: np.ndarray, table_rows: tuple[int, ...]) -> np.ndarray:
    """Per-lookup probability of each global row within its table, from profiled access
    counts (a table never accessed is taken as uniform)."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.shape != (sum(table_rows),) or (counts < 0).any():
        raise PlanError("counts", f"must be {sum(table_rows)} non-negative access counts")
    out = np.empty_like(counts)
    start = 0
    for rows in table_rows:
        block = counts[start:start + rows]
        total = block.sum()
        out[start:start + rows] = block / total if total > 0 else 1.0 / rows
        start += rows
    return out


def ranked_rows(probabilities: np.ndarray) -> np.ndarray:
    """Global rows, most frequently accessed first (ties by row ID). Every table has one bag
    per sample, so per-lookup probabilities compare across tables."""
    return np.lexsort((np.arange(len(probabilities)), -np.asarray(probabilities)))


def hot_row_bytes(embedding_dim: int, optimizer: str, element_bytes: int = 4) -> int:
    """Memory of one replicated row on every rank: its weights and its optimizer state."""
    return (embedding_dim + (1 if optimizer == "rowwise_adagrad" else 0)) * element_bytes


@dataclass
class HotSetChoice:
    """The planner's answer.

    Attributes:
        hot_rows: sorted global IDs to replicate.
        size: K = len(hot_rows).
        modelled_s: modelled iteration time with them (critical path).
        baseline_s: modelled time with none (row-wise with dedup).
        curve: (K, modelled time) at every K evaluated.
        memory_bytes_per_rank: the replicas' weights and optimizer state.
        reason: one line: what was chosen and why.
    """

    hot_rows: tuple[int, ...]
    size: int
    modelled_s: float
    baseline_s: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    memory_bytes_per_rank: float = 0.0
    reason: str = ""


def objective(hot_rows: tuple[int, ...], probabilities: np.ndarray, *, plan_base: ShardingPlan,
              batch_size_per_rank: int, embedding_dim: int, cluster: Any, bag_size: int = 1,
              element_bytes: int = 4, id_bytes: int = 8, compute_s: float = 0.0,
              dense_param_count: int = 0, touched_counts: bool = False,
              overlap: bool = False, fuse_allreduce: bool = False) -> float:
    """Modelled iteration time of the hybrid scheme with ``hot_rows`` replicated."""
    from .perfmodel import expected_phase_bytes, iteration_time

    plan = ShardingPlan(world_size=plan_base.world_size, table_rows=plan_base.table_rows,
                        sharding="row", hot_rows=tuple(sorted(int(g) for g in hot_rows)))
    phases = expected_phase_bytes(
        probabilities, plan=plan, scheme="hybrid", batch_size_per_rank=batch_size_per_rank,
        embedding_dim=embedding_dim, bag_size=bag_size, element_bytes=element_bytes,
        id_bytes=id_bytes, dense_param_count=dense_param_count, touched_counts=touched_counts,
        fuse_allreduce=fuse_allreduce)
    return iteration_time(phases, cluster, compute_s=compute_s, overlap=overlap)


def _grid(k_max: int) -> list[int]:
    ks = {0, k_max}
    k = 1
    while k < k_max:
        ks.add(k)
        k = k * 2
    return sorted(ks)


def choose_hot_set(probabilities: np.ndarray, *, plan_base: ShardingPlan,
                   batch_size_per_rank: int, embedding_dim: int, cluster: Any,
                   memory_budget_bytes: float, optimizer: str = "sgd", bag_size: int = 1,
                   element_bytes: int = 4, id_bytes: int = 8, compute_s: float = 0.0,
                   dense_param_count: int = 0, touched_counts: bool = False,
                   overlap: bool = False, fuse_allreduce: bool = False) -> HotSetChoice:
    """The top-K rows whose replication minimises the modelled iteration time within
    ``memory_budget_bytes`` per rank (K = 0 when nothing beats it by `MIN_GAIN`)."""
    if not (isinstance(memory_budget_bytes, (int, float)) and memory_budget_bytes >= 0):
        raise PlanError("memory_budget", f"must be >= 0 bytes, got {memory_budget_bytes!r}")
    probabilities = np.asarray(probabilities, dtype=np.float64)
    order = ranked_rows(probabilities)
    per_row = hot_row_bytes(embedding_dim, optimizer, element_bytes)
    k_max = int(min(len(order), memory_budget_bytes // per_row))
    kwargs = dict(plan_base=plan_base, batch_size_per_rank=batch_size_per_rank,
                  embedding_dim=embedding_dim, cluster=cluster, bag_size=bag_size,
                  element_bytes=element_bytes, id_bytes=id_bytes, compute_s=compute_s,
                  dense_param_count=dense_param_count, touched_counts=touched_counts,
                  overlap=overlap, fuse_allreduce=fuse_allreduce)
    seen: dict[int, float] = {}

    def score(k: int) -> float:
        if k not in seen:
            seen[k] = objective(tuple(order[:k]), probabilities, **kwargs)
        return seen[k]

    for k in _grid(k_max):
        score(k)
    # refine between the best grid point's neighbours (the curve is smooth in K)
    for _ in range(12):
        ks = sorted(seen)
        best = min(ks, key=lambda k: (seen[k], k))
        i = ks.index(best)
        lo, hi = ks[max(i - 1, 0)], ks[min(i + 1, len(ks) - 1)]
        mids = {(lo + best) // 2, (best + hi) // 2} - set(seen)
        if not mids:
            break
        for k in mids:
            score(k)
    baseline = seen[0]
    best = min(sorted(seen), key=lambda k: (seen[k], k))
    if best > 0 and seen[best] > baseline * (1 - MIN_GAIN):
        reason = (f"declined: the best replication (K={best}) models {seen[best] * 1e3:.3f} ms "
                  f"against {baseline * 1e3:.3f} ms without, under the {MIN_GAIN:.0%} margin")
        best = 0
    elif best == 0:
        reason = (f"declined: no K up to {k_max} (the memory budget's limit) models faster "
                  f"than {baseline * 1e3:.3f} ms without replication")
    else:
        reason = (f"replicate the {best} hottest rows: {seen[best] * 1e3:.3f} ms modelled "
                  f"against {baseline * 1e3:.3f} ms without ({baseline / seen[best]:.2f}x)")
    return HotSetChoice(hot_rows=tuple(sorted(int(g) for g in order[:best])), size=best,
                        modelled_s=seen[best], baseline_s=baseline,
                        curve=sorted(seen.items()), memory_bytes_per_rank=best * per_row,
                        reason=reason)


def brute_force_hot_set(probabilities: np.ndarray, *, memory_budget_bytes: float,
                        optimizer: str = "sgd", **kwargs: Any) -> HotSetChoice:
    """The best of EVERY subset of rows within the budget (``2^rows`` model calls; at most
    `BRUTE_FORCE_MAX_ROWS` rows)."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    n = len(probabilities)
    if n > BRUTE_FORCE_MAX_ROWS:
        raise PlanError("table_rows", f"brute force takes at most {BRUTE_FORCE_MAX_ROWS} rows, "
                        f"got {n}")
    per_row = hot_row_bytes(kwargs["embedding_dim"], optimizer, kwargs.get("element_bytes", 4))
    k_max = int(min(n, memory_budget_bytes // per_row))
    best: tuple[float, tuple[int, ...]] | None = None
    baseline = objective((), probabilities, **kwargs)
    for k in range(k_max + 1):
        for subset in itertools.combinations(range(n), k):
            value = objective(subset, probabilities, **kwargs)
            if best is None or value < best[0] - 1e-15 * max(abs(value), 1.0):
                best = (value, subset)
    assert best is not None
    value, subset = best
    return HotSetChoice(hot_rows=subset, size=len(subset), modelled_s=value,
                        baseline_s=baseline, memory_bytes_per_rank=len(subset) * per_row,
                        reason=f"brute force over all subsets of {n} rows")
