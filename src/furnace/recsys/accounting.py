"""Closed-form byte counts of one engine step, from the batch alone (design note `recsys.md`
Sec. 2.4's accounting, made exact for a given batch).

`exact_bytes` counts what `engine.ShardedTrainer` sends per phase and rank, with no process
group: it is the check on the engine's `CommLog` (tests require equality) and the "measured"
side of the performance model's expected counts.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .batch import Batch
from .config import EngineConfig, ShardingPlan

__all__ = ["busiest_rank_bytes", "exact_bytes", "request_matrix"]


def _all_reduce_bytes(num_bytes: int, world_size: int) -> int:
    # the ring model of `furnace.runtime.comm.traffic`
    return 2 * (world_size - 1) * num_bytes // world_size if world_size > 1 else 0


def request_matrix(batch: Batch, plan: ShardingPlan, *, dedup: bool) -> torch.Tensor:
    """``[W, W]``: rows rank ``s`` requests from owner ``o`` in one step (cold rows only;
    distinct rows per pair when ``dedup``, occurrences otherwise)."""
    w = plan.world_size
    hot = plan.hot_slot()
    out = torch.zeros(w, w, dtype=torch.int64)
    for s in range(w):
        flat = torch.cat(batch.local(s, w).global_ids(plan.table_offsets))
        cold = flat[hot[flat] < 0]
        if dedup:
            cold = torch.unique(cold)
        out[s] = torch.bincount(plan.owner_of(cold), minlength=w)
    return out


def exact_bytes(batch: Batch, plan: ShardingPlan, engine: EngineConfig, *, embedding_dim: int,
                dense_param_count: int, element_bytes: int, id_bytes: int = 8,
                touched_counts: bool = False) -> dict[tuple[str, int], int]:
    """Bytes each rank sends in one step of ``engine`` on the global ``batch``, by
    ``(phase, rank)``; phases with no bytes are left out. ``touched_counts``: whether the hot
    all-reduce carries them (`engine.needs_touched_counts`)."""
    w = plan.world_size
    row = embedding_dim * element_bytes
    out: dict[tuple[str, int], int] = defaultdict(int)
    if engine.scheme == "table_pooled":
        per = batch.batch_size // w
        for owner in plan.table_owner:
            for q in range(w):
                if q != owner:
                    out["vectors", owner] += per * row
                    out["grads", q] += per * row
    elif len(plan.hot_rows) < plan.total_rows:
        m = request_matrix(batch, plan, dedup=engine.dedup)
        m.fill_diagonal_(0)  # a rank's own rows never leave it
        for r in range(w):
            out["splits", r] += (w - 1) * id_bytes
            out["ids", r] += int(m[r].sum()) * id_bytes
            out["grads", r] += int(m[r].sum()) * row
            out["vectors", r] += int(m[:, r].sum()) * row
    k = len(plan.hot_rows)
    hot = (k * embedding_dim + (k if touched_counts else 0)) * element_bytes
    dense = dense_param_count * element_bytes
    for r in range(w):
        if engine.fuse_allreduce:
            out["allreduce", r] += _all_reduce_bytes(dense + hot, w)
        else:
            out["dense_allreduce", r] += _all_reduce_bytes(dense, w)
            if k:
                out["hot_allreduce", r] += _all_reduce_bytes(hot, w)
    return {key: v for key, v in out.items() if v}


def busiest_rank_bytes(counts: dict[tuple[str, int], int]) -> int:
    """The most bytes any one rank sends, all phases together."""
    per_rank: dict[int, int] = defaultdict(int)
    for (_, rank), v in counts.items():
        per_rank[rank] += v
    return max(per_rank.values(), default=0)
