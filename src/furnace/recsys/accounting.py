"""Closed-form byte counts of one engine step, from the batch alone (design note `recsys.md`
Sec. 2.4's accounting, made exact for a given batch).

`exact_bytes` counts what `engine.ShardedTrainer` sends per phase and rank, with no process
group: it is the check on the engine's `CommLog` (tests require equality) and the "measured"
side of the performance model's expected counts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from furnace.runtime.comm import traffic
from furnace.runtime.twolevel import hierarchical_all_reduce_bytes, is_two_level

from .batch import Batch
from .config import EngineConfig, ShardingPlan

__all__ = ["all_reduce_bytes", "busiest_rank_bytes", "exact_bytes", "request_matrix"]


def all_reduce_bytes(num_elements: int, element_bytes: int, world_size: int, *,
                     ranks_per_node: int = 1, inter_node_only: bool = False) -> int:
    """Bytes one rank sends in the engine's all-reduce of ``num_elements``: one ring over the
    world (the model of `furnace.runtime.comm.traffic`), or hierarchical when
    ``ranks_per_node`` makes two levels (`runtime.twolevel`). ``inter_node_only``: only the
    bytes that cross nodes (a flat ring's pace is its slowest link, so all of them when the
    world spans nodes)."""
    if world_size == 1:
        return 0
    if is_two_level(ranks_per_node, world_size):
        inside, across = hierarchical_all_reduce_bytes(
            num_elements, element_bytes, ranks_per_node=ranks_per_node,
            num_nodes=world_size // ranks_per_node)
        return across if inter_node_only else inside + across
    if inter_node_only and ranks_per_node >= world_size:
        return 0
    return traffic("all_reduce", rank=0, world_size=world_size,
                   nbytes=num_elements * element_bytes).bytes_sent


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
                touched_counts: bool = False, ranks_per_node: int = 1,
                inter_node_only: bool = False) -> dict[tuple[str, int], int]:
    """Bytes each rank sends in one step of ``engine`` on the global ``batch``, by
    ``(phase, rank)``; phases with no bytes are left out. ``touched_counts``: whether the hot
    all-reduce carries them (`engine.needs_touched_counts`). ``ranks_per_node``: the
    engine's node size (hierarchical all-reduces on two levels); ``inter_node_only``: count
    only the bytes that cross nodes (ranks ``r // ranks_per_node`` apart)."""
    w = plan.world_size
    row = embedding_dim * element_bytes
    node = torch.arange(w) // max(ranks_per_node, 1)
    # which (source, destination) pairs count: every other rank, or the other nodes' ranks
    counted = node[:, None] != node[None, :] if inter_node_only else ~torch.eye(w, dtype=torch.bool)
    out: dict[tuple[str, int], int] = defaultdict(int)
    if engine.scheme == "table_pooled":
        per = batch.batch_size // w
        for owner in plan.table_owner:
            for q in range(w):
                if counted[owner, q]:
                    out["vectors", owner] += per * row
                    out["grads", q] += per * row
    elif len(plan.hot_rows) < plan.total_rows:
        m = request_matrix(batch, plan, dedup=engine.dedup)
        m[~counted] = 0  # a rank's own rows never leave it
        for r in range(w):
            out["splits", r] += int(counted[r].sum()) * id_bytes
            out["ids", r] += int(m[r].sum()) * id_bytes
            out["grads", r] += int(m[r].sum()) * row
            out["vectors", r] += int(m[:, r].sum()) * row
    k = len(plan.hot_rows)
    hot = k * embedding_dim + (k if touched_counts else 0)
    kw: dict[str, Any] = dict(ranks_per_node=ranks_per_node, inter_node_only=inter_node_only)
    for r in range(w):
        if engine.fuse_allreduce:
            out["allreduce", r] += all_reduce_bytes(dense_param_count + hot, element_bytes,
                                                    w, **kw)
        else:
            out["dense_allreduce", r] += all_reduce_bytes(dense_param_count, element_bytes,
                                                          w, **kw)
            if k:
                out["hot_allreduce", r] += all_reduce_bytes(hot, element_bytes, w, **kw)
    return {key: v for key, v in out.items() if v}


def busiest_rank_bytes(counts: dict[tuple[str, int], int]) -> int:
    """The most bytes any one rank sends, all phases together."""
    per_rank: dict[int, int] = defaultdict(int)
    for (_, rank), v in counts.items():
        per_rank[rank] += v
    return max(per_rank.values(), default=0)
