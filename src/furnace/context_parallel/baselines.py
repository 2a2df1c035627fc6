"""The baseline context-parallel schemes UltraAttn is compared with (Yang et al., SC'25,
§6 baselines; design note §2.1, §4 and §6.1 item 6), as `Plan`s on the same data model,
plus the closed-form traffic of DeepSpeed-Ulysses.

- ring (``ring``, ``zigzag_ring``, ``striped_ring`` for the three layouts): the owner of a
  row computes it; in step s = 1..CP-1 every rank passes to its successor the kv blocks that
  started on rank (g-s+1) mod CP, all of them, whether the receiver needs them or not (ring
  attention's waste, which `PlanStats.unused_in` counts). The backward passes kv the same
  way and returns the dk/dv partials straight to the kv owners, the same bytes as passing
  the dk/dv accumulators round the ring; q never moves.
- ``allgather_kv`` (PyTorch flex-CP style): owner computes, and one all-to-all gives every
  rank all kv blocks.
- ``needed_kv`` (zero-redundancy, MagiAttention style): owner computes, and each rank
  receives exactly the kv blocks its rows need, directly from their owners.
- Ulysses (`ulysses_stats`): all-to-all q, k, v from sequence- to head-sharded, attention
  over the whole sequence for H/CP heads, all-to-all of out back; the backward moves dout
  the same way and dq, dk, dv back: one all_to_all_single per tensor, 4 forward and 4
  backward. Nothing is planned there, so only its bytes are given, in closed form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import LayoutError, PlanError
from .layout import LAYOUTS, Layout, make_layout
from .masks import EMPTY, BlockGrid
from .plan import (
    AttentionShape,
    IntArray,
    Plan,
    TrafficFigures,
    Transfer,
    build_plan,
    owner_computes_plan,
    transfer_objects,
)

_KV = 1  # PAYLOAD_KINDS.index("kv")

__all__ = [
    "BASELINES",
    "RING_SCHEMES",
    "UlyssesStats",
    "allgather_kv_plan",
    "baseline_plans",
    "needed_kv_plan",
    "owner_assignment",
    "ring_plan",
    "ulysses_stats",
]

# layout kind -> the ring scheme's name
RING_SCHEMES: dict[str, str] = {"contiguous": "ring", "zigzag": "zigzag_ring",
                                "striped": "striped_ring"}
BASELINES = ("ring", "zigzag_ring", "striped_ring", "allgather_kv", "needed_kv")


def _layout(grid: BlockGrid, layout_kind: str, num_ranks: int | None) -> Layout:
    if num_ranks is None:
        raise PlanError("num_ranks", "is required (the number of context-parallel ranks)")
    if layout_kind not in LAYOUTS:
        raise PlanError("layout", f"must be one of {', '.join(LAYOUTS)}, got {layout_kind!r}")
    return make_layout(layout_kind, grid.num_blocks, num_ranks)


def _nonempty(grid: BlockGrid) -> tuple[IntArray, IntArray]:
    rows, cols = np.nonzero(grid.kinds != EMPTY)
    return rows.astype(np.int64), cols.astype(np.int64)


def owner_assignment(grid: BlockGrid, layout: Layout) -> dict[tuple[int, int], int]:
    """Every non-empty block (r, c) -> the owner of row r (owner computes)."""
    if layout.num_blocks != grid.num_blocks:
        raise PlanError("layout", f"has {layout.num_blocks} blocks, the grid "
                                  f"{grid.num_blocks}; they must match")
    rows, cols = _nonempty(grid)
    owners = np.asarray(layout.owners, dtype=np.int64)
    return dict(zip(zip(rows.tolist(), cols.tolist()), owners[rows].tolist()))


def ring_plan(grid: BlockGrid, shape: AttentionShape, layout_kind: str = "contiguous",
              num_ranks: int | None = None, *, granularity: str = "block") -> Plan:
    """Ring attention under ``layout_kind`` (scheme ring / zigzag_ring / striped_ring):
    rank g computes (r, c) for its own rows r in the step in which kv block c reaches it."""
    layout = _layout(grid, layout_kind, num_ranks)
    size, p = layout.num_ranks, grid.num_blocks
    owners = np.asarray(layout.owners, dtype=np.int64)
    stages: list[tuple[Transfer, ...]] = [()]
    if size > 1:
        # in step s rank g = (owner(b) + s - 1) mod CP forwards block b; every step moves
        # each block once, ordered by (src, block)
        steps = np.arange(1, size, dtype=np.int64)[:, None]
        sender = (owners[None, :] + steps - 1) % size
        order = np.argsort(sender * p + np.arange(p, dtype=np.int64)[None, :], axis=1)
        src = np.take_along_axis(sender, order, axis=1).ravel()
        transfers = transfer_objects(src, (src + 1) % size,
                                     np.full(src.size, _KV, dtype=np.int64), order.ravel())
        stages += [tuple(transfers[i * p:(i + 1) * p]) for i in range(size - 1)]
    rows, cols = _nonempty(grid)
    # kv block c started on owner(c) and reaches rank g after (g - owner(c)) mod CP steps
    kernel_stage = (owners[rows] - owners[cols]) % size
    return owner_computes_plan(RING_SCHEMES[layout_kind], grid, layout, shape, stages,
                               kernel_stage, granularity=granularity, info={})


def allgather_kv_plan(grid: BlockGrid, shape: AttentionShape, layout_kind: str = "contiguous",
                      num_ranks: int | None = None, *, granularity: str = "block") -> Plan:
    """Owner computes; one all-to-all in which every rank sends all its kv blocks to every
    other rank (local blocks are computed before it arrives)."""
    layout = _layout(grid, layout_kind, num_ranks)
    size = layout.num_ranks
    owners = np.asarray(layout.owners, dtype=np.int64)
    stages: list[tuple[Transfer, ...]] = [()]
    if size > 1:
        blocks, dst = np.nonzero(owners[:, None] != np.arange(size, dtype=np.int64)[None, :])
        src = owners[blocks]
        order = np.lexsort((blocks, dst, src))
        stages.append(tuple(transfer_objects(src[order], dst[order].astype(np.int64),
                                             np.full(src.size, _KV, dtype=np.int64),
                                             blocks[order].astype(np.int64))))
    rows, cols = _nonempty(grid)
    kernel_stage = (owners[rows] != owners[cols]).astype(np.int64)
    return owner_computes_plan("allgather_kv", grid, layout, shape, stages, kernel_stage,
                               granularity=granularity, info={})


def needed_kv_plan(grid: BlockGrid, shape: AttentionShape, layout_kind: str = "contiguous",
                   num_ranks: int | None = None, *, granularity: str = "block") -> Plan:
    """Owner computes; each rank receives exactly the kv blocks its rows need, straight
    from their owners (`build_plan` with `owner_assignment`)."""
    layout = _layout(grid, layout_kind, num_ranks)
    return build_plan("needed_kv", grid, layout, shape, owner_assignment(grid, layout),
                      granularity=granularity, info={"assigner": "owner_computes"})


def _max_owner_work(grid: BlockGrid, layout: Layout) -> int:
    rows, cols = _nonempty(grid)
    owners = np.asarray(layout.owners, dtype=np.int64)
    work = np.bincount(owners[rows], weights=grid.counts[rows, cols].astype(np.float64),
                       minlength=layout.num_ranks)
    return int(work.max()) if work.size else 0


def baseline_plans(grid: BlockGrid, shape: AttentionShape, num_ranks: int, *,
                   granularity: str = "block",
                   schemes: Sequence[str] = BASELINES) -> dict[str, Plan]:
    """Every baseline of ``schemes`` that applies, by scheme name: the three rings (one per
    layout that divides the grid), allgather_kv under the layout with the best
    owner-computes balance, and needed_kv under the layout with the fewest bottleneck-port
    bytes (`PlanStats.max_port`); each plan's ``info["layout"]`` names its layout."""
    unknown = [name for name in schemes if name not in BASELINES]
    if unknown:
        raise PlanError("schemes", f"must be among {', '.join(BASELINES)}, got {unknown[0]!r}")
    layouts: dict[str, Layout] = {}
    refusals: list[str] = []
    for kind in LAYOUTS:
        try:
            layouts[kind] = make_layout(kind, grid.num_blocks, num_ranks)
        except LayoutError as exc:
            refusals.append(f"{kind}: {exc.allowed}")
    if not layouts:
        raise PlanError("num_ranks", f"no layout applies to {grid.num_blocks} blocks on "
                                     f"{num_ranks} ranks ({'; '.join(refusals)})")
    plans: dict[str, Plan] = {}
    for kind in layouts:
        if RING_SCHEMES[kind] in schemes:
            plans[RING_SCHEMES[kind]] = ring_plan(grid, shape, kind, num_ranks,
                                                  granularity=granularity)
    # LAYOUTS order breaks ties, so contiguous wins when the layouts are equal
    order = list(layouts)
    if "allgather_kv" in schemes:
        allgather_kind = min(order, key=lambda k: (_max_owner_work(grid, layouts[k]),
                                                   order.index(k)))
        plans["allgather_kv"] = allgather_kv_plan(grid, shape, allgather_kind, num_ranks,
                                                  granularity=granularity)
    if "needed_kv" not in schemes:
        return plans
    needed = {kind: needed_kv_plan(grid, shape, kind, num_ranks, granularity=granularity)
              for kind in layouts}
    best = min(order, key=lambda k: (needed[k].stats().max_port, needed[k].stats().balance,
                                     order.index(k)))
    info = needed[best].info
    if not isinstance(info, dict):
        raise PlanError("plan", "build_plan must give a plan with a dict of info")
    info["max_port_by_layout"] = {kind: plan.stats().max_port for kind, plan in needed.items()}
    plans["needed_kv"] = needed[best]
    return plans


@dataclass(frozen=True)
class UlyssesStats(TrafficFigures):
    """Closed-form per-rank figures of DeepSpeed-Ulysses over the same sequence-sharded
    inputs; bytes as an executor's `CommLog` records them."""

    forward_in: tuple[int, ...]
    forward_out: tuple[int, ...]
    backward_in: tuple[int, ...]
    backward_out: tuple[int, ...]
    messages: tuple[int, ...]  # (all_to_all, peer) pairs with bytes that the rank sends
    # all-heads-equivalent elements per rank: every rank computes every non-empty element
    # for H/CP heads, i.e. total_work / CP
    work: tuple[float, ...]
    unused_in: tuple[int, ...]  # always 0: every received element is used
    num_collectives: int  # 8 (q, k, v, out; dout, dq, dk, dv), 0 on one rank

    def _work_values(self) -> tuple[float, ...]:
        return self.work


def ulysses_stats(grid: BlockGrid, shape: AttentionShape, num_ranks: int, *,
                  layout: Layout | None = None) -> UlyssesStats | None:
    """Ulysses' traffic on ``num_ranks`` ranks whose tokens follow ``layout`` (contiguous
    by default; it matters only for a ragged last block), or None when ``num_ranks`` does
    not divide both num_heads and num_kv_heads."""
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise PlanError("num_ranks", f"must be an integer >= 1, got {num_ranks!r}")
    if shape.num_heads % num_ranks or shape.num_kv_heads % num_ranks:
        return None
    if layout is None:
        layout = make_layout("contiguous", grid.num_blocks, num_ranks)
    if layout.num_ranks != num_ranks or layout.num_blocks != grid.num_blocks:
        raise PlanError("layout", f"must have {num_ranks} ranks and {grid.num_blocks} blocks, "
                                  f"got {layout.num_ranks} and {layout.num_blocks}")
    lens = np.minimum(grid.block_size,
                      grid.seq_len - np.arange(grid.num_blocks, dtype=np.int64) * grid.block_size)
    local = np.bincount(np.asarray(layout.owners, dtype=np.int64), weights=lens,
                        minlength=num_ranks).astype(np.int64)
    others = grid.seq_len - local  # tokens held by the other ranks
    peers = num_ranks - 1
    # bytes of one token of one head's (b, d) slice, and the heads each rank keeps
    unit = shape.batch * shape.head_dim * shape.itemsize
    q_heads = shape.num_heads // num_ranks
    kv_heads = shape.num_kv_heads // num_ranks
    to_heads = q_heads + 2 * kv_heads  # q, k, v: my tokens of your heads go out
    forward_out = (peers * local * to_heads + others * q_heads) * unit
    forward_in = (others * to_heads + peers * local * q_heads) * unit
    # dout goes out like q; dq, dk, dv come back like out
    backward_out = (peers * local * q_heads + others * to_heads) * unit
    backward_in = (others * q_heads + peers * local * to_heads) * unit
    # a rank sends to a peer in q/k/v/dout when it holds tokens, in out/dq/dk/dv when the
    # peer does
    holds = (local > 0).astype(np.int64)
    nonzero_peers = int(holds.sum()) - holds
    own = holds * peers
    messages = 4 * own + 4 * nonzero_peers if peers else np.zeros(num_ranks, dtype=np.int64)
    work = float(grid.total_work) / num_ranks

    def ints(a: IntArray) -> tuple[int, ...]:
        return tuple(int(v) for v in a.tolist())

    return UlyssesStats(forward_in=ints(forward_in), forward_out=ints(forward_out),
                        backward_in=ints(backward_in), backward_out=ints(backward_out),
                        messages=ints(messages), work=(work,) * num_ranks,
                        unused_in=(0,) * num_ranks,
                        num_collectives=8 if peers else 0)

