"""The performance model of one training iteration: expected bytes per phase and rank, and
the critical-path time on a two-level cluster (design note `recsys.md` Sec. 2.4; the poster
names a performance model but not its form, so this one is [recon], reconstructed from HugeCTR's
hybrid-embedding cost model and FasterMoE's, and checked here against exact counts).

With W ranks, B_l samples per rank, per-lookup probability p_r of row r in its table and n
lookups per bag, a source rank asks row r's owner for it with probability
``q_r = 1 - E[(1 - p_r)^L]`` (L the rank's lookups of that table; deduplicated schemes) or
``p_r * B_l * n`` times in expectation (one request per occurrence). Each request costs an ID
(i bytes) out, a vector (D e bytes) back and a gradient (D e bytes) back. A replicated row
costs its share of the all-reduce instead: ``2 (W-1)/W * D e`` per rank (ring), plus a touched
count only where weight decay needs one. Time is that of the busiest rank, phase after phase,
each phase ``alpha + bytes / beta`` over the slower link class it crosses; with overlap only
what the engine runs concurrently leaves the critical path (`iteration_time`). On two levels
the all-reduces are hierarchical (`runtime.twolevel`): the same bytes per rank as one ring in
total, but only ``2 (N-1)/N * n/G`` of them across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from furnace.runtime.cost import (
    collective_time,
    hierarchical_all_reduce_time,
    link_time,
    link_time_array,
)
from furnace.runtime.topology import Link

from .config import PlanError, ShardingPlan

__all__ = ["A2A_PHASES", "ClusterModel", "expected_phase_bytes", "iteration_time",
           "phase_times"]

A2A_PHASES = ("splits", "ids", "vectors", "grads")


@dataclass(frozen=True)
class ClusterModel:
    """W = ranks_per_node * num_nodes ranks; ``intra`` links ranks of one node, ``inter``
    ranks of different nodes (each rank its own NIC, as on the H100/H200 presets)."""

    ranks_per_node: int
    num_nodes: int
    intra: Link
    inter: Link
    name: str = ""

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.num_nodes

    @classmethod
    def from_topology(cls, topology: Any, world_size: int) -> ClusterModel:
        per_node = min(topology.ranks_per_node, world_size)
        if world_size % per_node:
            raise PlanError("ranks_per_node", f"must divide the {world_size} ranks, got "
                            f"{topology.ranks_per_node}")
        return cls(per_node, world_size // per_node, topology.intra_node, topology.inter_node,
                   topology.name)

    def exchange_time(self, busiest_bytes: float) -> float:
        """One all-to-all phase paced by its busiest rank, whose peers are spread evenly:
        ``(G-1)/(W-1)`` of its bytes stay in the node, the rest cross nodes, both in
        parallel."""
        w = self.world_size
        if w == 1:
            return 0.0
        inside = busiest_bytes * (self.ranks_per_node - 1) / (w - 1)
        across = busiest_bytes - inside
        times = [link_time(self.intra, inside)] if self.ranks_per_node > 1 else []
        if self.num_nodes > 1:
            times.append(link_time(self.inter, across))
        return max(times)

    def all_to_all_time(self, send_bytes: Any) -> float:
        """One all-to-all phase: ``send_bytes`` is either the busiest rank's bytes (spread
        evenly over its peers, as `exchange_time`) or the ``[W, W]`` matrix of bytes rank
        ``s`` sends to rank ``d``; then each rank's intra- and inter-node bytes are timed on
        their own link class and the slowest rank sets the pace."""
        matrix = np.asarray(send_bytes, dtype=np.float64)
        if matrix.ndim == 0:
            return self.exchange_time(float(matrix))
        w = self.world_size
        if matrix.shape != (w, w):
            raise PlanError("send_bytes", f"must be a scalar or a [{w}, {w}] matrix, got "
                            f"{matrix.shape}")
        if w == 1:
            return 0.0
        node = np.arange(w) // self.ranks_per_node
        same = node[:, None] == node[None, :]
        off_rank = ~np.eye(w, dtype=bool)
        inside = np.where(same & off_rank, matrix, 0.0).sum(axis=1)
        across = np.where(~same, matrix, 0.0).sum(axis=1)
        per_rank = np.zeros(w)
        if self.ranks_per_node > 1:
            per_rank = np.maximum(per_rank, link_time_array(self.intra, inside))
        if self.num_nodes > 1:
            per_rank = np.maximum(per_rank, link_time_array(self.inter, across))
        return float(per_rank.max())

    def all_reduce_time(self, num_bytes: float) -> float:
        if self.world_size == 1 or num_bytes == 0:
            return 0.0
        if self.num_nodes == 1:
            return collective_time("all_reduce", num_bytes, self.world_size, self.intra)
        if self.ranks_per_node == 1:
            return collective_time("all_reduce", num_bytes, self.world_size, self.inter)
        return hierarchical_all_reduce_time(num_bytes, ranks_per_node=self.ranks_per_node,
                                            num_nodes=self.num_nodes, intra=self.intra,
                                            inter=self.inter)


def _miss_probability(p: np.ndarray, batch_size: int, bag_size: int) -> np.ndarray:
    """``E[(1 - p)^L]`` for the L lookups of one rank's ``batch_size`` bags: one each when
    one-hot, else lengths uniform on ``1..2n-1`` independently per bag (as the generator
    draws them)."""
    if bag_size == 1:
        return (1.0 - p) ** batch_size
    lengths = np.arange(1, 2 * bag_size)
    per_bag = ((1.0 - p)[:, None] ** lengths[None, :]).mean(axis=1)
    return np.asarray(per_bag ** batch_size)


def expected_phase_bytes(probabilities: np.ndarray, *, plan: ShardingPlan, scheme: str,
                         batch_size_per_rank: int, embedding_dim: int, bag_size: int = 1,
                         element_bytes: int = 4, id_bytes: int = 8, dense_param_count: int = 0,
                         touched_counts: bool = False,
                         fuse_allreduce: bool = False) -> dict[str, np.ndarray]:
    """Expected bytes each rank sends per iteration, by phase, in the engine's encoding
    (`accounting.exact_bytes` is the same count for one given batch)."""
    w = plan.world_size
    p = np.asarray(probabilities, dtype=np.float64)
    if p.shape != (plan.total_rows,):
        raise PlanError("probabilities", f"need one per row ({plan.total_rows}), got {p.shape}")
    row = embedding_dim * element_bytes
    b = batch_size_per_rank
    out: dict[str, np.ndarray] = {}
    if scheme == "table_pooled":
        owned = np.bincount(np.asarray(plan.table_owner), minlength=w).astype(np.float64)
        out["vectors"] = owned * b * (w - 1) * row
        out["grads"] = (plan.num_tables - owned) * b * row
    elif len(plan.hot_rows) < plan.total_rows and w > 1:
        cold = np.ones(plan.total_rows, dtype=bool)
        cold[list(plan.hot_rows)] = False
        if scheme in ("row_dedup", "hybrid"):
            requests = 1.0 - _miss_probability(p, b, bag_size)
        elif scheme == "row":
            requests = p * b * bag_size
        else:
            raise PlanError("scheme", f"unknown scheme {scheme!r}")
        requests = np.where(cold, requests, 0.0)
        owners = np.arange(plan.total_rows) % w
        per_owner = np.bincount(owners, weights=requests, minlength=w)
        # what every source asks of owners other than itself (sources are alike in law)
        asked = per_owner.sum() - per_owner
        out["splits"] = np.full(w, float((w - 1) * id_bytes))
        out["ids"] = asked * id_bytes
        out["vectors"] = per_owner * (w - 1) * row
        out["grads"] = asked * row
    k = len(plan.hot_rows)
    hot = (k * embedding_dim + (k if touched_counts else 0)) * element_bytes
    dense = dense_param_count * element_bytes

    def ring(n: float) -> np.ndarray:
        return np.full(w, 2.0 * (w - 1) * n / w)

    if fuse_allreduce:
        out["allreduce"] = ring(dense + hot)
    else:
        if dense:
            out["dense_allreduce"] = ring(dense)
        if k:
            out["hot_allreduce"] = ring(hot)
    return out


def phase_times(phase_bytes: dict[str, np.ndarray], cluster: ClusterModel) -> dict[str, float]:
    """Modelled seconds of each phase, paced by its busiest rank."""
    times = {}
    for phase, per_rank in phase_bytes.items():
        busiest = float(np.max(per_rank)) if len(per_rank) else 0.0
        if phase in A2A_PHASES:
            times[phase] = cluster.exchange_time(busiest)
        else:
            # the ring all-reduce of N sends 2(W-1)/W N per rank: recover N
            w = cluster.world_size
            n = busiest * w / (2.0 * (w - 1)) if w > 1 else 0.0
            times[phase] = cluster.all_reduce_time(n)
    return times


def iteration_time(phase_bytes: dict[str, np.ndarray], cluster: ClusterModel, *,
                   compute_s: float = 0.0, overlap: bool = False) -> float:
    """Critical path of one iteration: compute plus every phase in turn.

    With ``overlap`` (the engine's schedule, design note Sec. 2.5), what the engine really
    runs concurrently is taken off the path, and nothing else: the next batch's ID
    exchange ("splits", "ids") runs behind this step's compute (posted before the
    backward). The vector exchange flies only while the bottom MLP and the hot lookups run,
    which is small next to it and not credited. The gradient exchange and the all-reduces
    share one link with each other (a FIFO per rank, as the emulator and a NIC keep it), so
    posting them together saves no time and they stay on the path.
    """
    times = phase_times(phase_bytes, cluster)
    ids = times.get("splits", 0.0) + times.get("ids", 0.0)
    vectors = times.get("vectors", 0.0)
    rest = sum(t for ph, t in times.items() if ph not in ("splits", "ids", "vectors"))
    if overlap:
        return compute_s + max(0.0, ids - compute_s) + vectors + rest
    return compute_s + ids + vectors + rest
