"""The plan data model of UltraAttn's context parallelism (Yang et al., SC'25): who computes
which block of the attention grid, which payloads move in which all-to-all, and what that
costs in bytes and work (design note §2.3 traffic terms, §2.5 kernel granularity, §2.7 the
merge and the backward reductions).

A `Plan` is static: every rank runs the same plan, stage by stage. Stage 0 computes what
needs only local data; stage ``s >= 1`` is one ``all_to_all_single`` followed by the kernels
whose inputs have then arrived. After the forward stages, `Plan.forward_reduce` sends each
partial (out, lse) of a row to the row's owner, who merges (§2.7). The backward mirrors it:
the row payload is ``q_bwd`` (q, dout, the global lse and delta), and `Plan.backward_reduce`
returns dq partials to q owners and dk/dv partials to kv owners. Nothing received in the
forward is kept for the backward: the backward fetches its inputs again, which is what the
bytes here count.

`build_plan` turns any assignment of blocks to ranks into the direct plan (each needed
payload goes straight from its owner, staged by peer distance), `check_plan` enforces the
execution semantics above, and `Plan.stats` gives the machine-independent figures (bytes in
and out per rank, messages, work, unused bytes). Building and counting are vectorised with
numpy, since planners evaluate many candidates on grids with up to a million blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, NoReturn

import numpy as np
import numpy.typing as npt
import torch

from furnace.runtime.cliargs import require_positive_ints

from .config import PlanError
from .layout import Layout
from .masks import EMPTY, FULL, BlockGrid

__all__ = [
    "DTYPES",
    "GRANULARITIES",
    "STAGINGS",
    "PAYLOAD_KINDS",
    "AttentionShape",
    "Kernel",
    "PayloadKind",
    "Plan",
    "PlanStats",
    "Stage",
    "TrafficFigures",
    "Transfer",
    "block_units",
    "build_plan",
    "check_plan",
    "owner_computes_plan",
    "transfer_objects",
]

PayloadKind = Literal["q", "kv", "out", "q_bwd", "dq", "dkv"]
PAYLOAD_KINDS: tuple[PayloadKind, ...] = ("q", "kv", "out", "q_bwd", "dq", "dkv")
_KIND_INDEX: dict[str, int] = {kind: i for i, kind in enumerate(PAYLOAD_KINDS)}
_Q, _KV, _OUT, _Q_BWD, _DQ, _DKV = range(len(PAYLOAD_KINDS))

# name -> (torch dtype, bytes per element)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float16": (torch.float16, 2),
    "bfloat16": (torch.bfloat16, 2),
    "float32": (torch.float32, 4),
    "float64": (torch.float64, 8),
}
GRANULARITIES = ("block", "row")
# how a direct plan's transfers are staged: one peer distance per exchange (pipelined like a
# ring), or every transfer in one exchange (the "P2Ps into one collective" substitution of
# UltraAttn §4.3): fewer latencies, and the ranks' lockstep wait is paid once, not per stage
STAGINGS = ("distance", "single")

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class AttentionShape:
    """The attention problem a plan moves bytes for: batch, heads (grouped-query when
    ``num_kv_heads < num_heads``), head size and the dtype of every payload (lse and delta
    travel in the same dtype as q)."""

    batch: int = 1
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 64
    dtype: str = "float32"

    def __post_init__(self) -> None:
        require_positive_ints(self, ("batch", "num_heads", "num_kv_heads", "head_dim"),
                              PlanError)
        if self.num_heads % self.num_kv_heads:
            raise PlanError("num_kv_heads", f"must divide num_heads={self.num_heads}, "
                                            f"got {self.num_kv_heads}")
        if self.dtype not in DTYPES:
            raise PlanError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def from_tensors(cls, q: torch.Tensor, k: torch.Tensor) -> AttentionShape:
        """The shape of q (B,H,L,D) and k (B,Hkv,L,D) in SDPA order."""
        if q.dim() != 4 or k.dim() != 4:
            raise PlanError("q", f"q and k must be 4-D (batch, heads, tokens, head_dim), "
                                 f"got {tuple(q.shape)} and {tuple(k.shape)}")
        names = {dtype: name for name, (dtype, _) in DTYPES.items()}
        if q.dtype not in names:
            raise PlanError("dtype", f"must be one of {', '.join(DTYPES)}, got {q.dtype}")
        return cls(batch=q.shape[0], num_heads=q.shape[1], num_kv_heads=k.shape[1],
                   head_dim=q.shape[3], dtype=names[q.dtype])

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype][0]

    def token_elements(self, kind: str) -> int:
        """Elements one token of a payload carries, summed over the batch."""
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        per_sample = {
            "q": heads * dim,
            "kv": 2 * kv_heads * dim,
            "out": heads * dim + heads,  # the partial output and its lse
            "q_bwd": 2 * heads * dim + 2 * heads,  # q, dout, lse, delta
            "dq": heads * dim,
            "dkv": 2 * kv_heads * dim,
        }.get(kind)
        if per_sample is None:
            raise PlanError("kind", f"must be one of {', '.join(PAYLOAD_KINDS)}, got {kind!r}")
        return self.batch * per_sample

    def payload_elements(self, kind: str, tokens: int) -> int:
        """Elements of a payload of ``tokens`` tokens (the batch included)."""
        return tokens * self.token_elements(kind)

    def payload_bytes(self, kind: str, tokens: int) -> int:
        return self.payload_elements(kind, tokens) * self.itemsize


@dataclass(frozen=True, slots=True)
class Kernel:
    """One block-attention call on ``rank`` over the cartesian product of its q and kv
    blocks; every pair of the product is non-empty and assigned to ``rank``."""

    rank: int
    q_blocks: tuple[int, ...]
    kv_blocks: tuple[int, ...]
    full: bool  # every covered block is FULL, so the call may skip the mask
    elements: int  # allowed (q, kv) pairs over the covered blocks (grid counts)


@dataclass(frozen=True, slots=True)
class Transfer:
    """One payload of one block from ``src`` to ``dst``: ``block`` is the q block for the
    row payloads (q, out, q_bwd, dq) and the kv block for kv and dkv."""

    src: int
    dst: int
    kind: PayloadKind
    block: int


@dataclass(frozen=True, slots=True)
class Stage:
    """One all_to_all_single (``transfers``; empty for stage 0) and the kernels that run
    once it has arrived."""

    transfers: tuple[Transfer, ...]
    kernels: tuple[Kernel, ...]


class TrafficFigures:
    """Derived figures shared by `PlanStats` and the closed-form Ulysses statistics
    (`furnace.context_parallel.baselines.UlyssesStats`)."""

    forward_in: tuple[int, ...]
    forward_out: tuple[int, ...]
    backward_in: tuple[int, ...]
    backward_out: tuple[int, ...]
    messages: tuple[int, ...]

    def _work_values(self) -> Sequence[float]:
        raise NotImplementedError

    @property
    def max_inbound(self) -> int:
        """Busiest receiver, forward and backward bytes together."""
        return max(f + b for f, b in zip(self.forward_in, self.backward_in))

    @property
    def max_forward_inbound(self) -> int:
        return max(self.forward_in)

    @property
    def max_port(self) -> int:
        """The bottleneck port: max over ranks and directions of fwd+bwd bytes (the ILP's
        objective, design note §2.3, in bytes)."""
        inbound = (f + b for f, b in zip(self.forward_in, self.backward_in))
        outbound = (f + b for f, b in zip(self.forward_out, self.backward_out))
        return max(itertools.chain(inbound, outbound))

    @property
    def max_forward_port(self) -> int:
        return max(max(self.forward_in), max(self.forward_out))

    @property
    def total_bytes(self) -> int:
        """Bytes moved by the whole forward and backward (each counted once, at its
        receiver)."""
        return sum(self.forward_in) + sum(self.backward_in)

    @property
    def total_forward_bytes(self) -> int:
        return sum(self.forward_in)

    @property
    def balance(self) -> float:
        """max work / mean work; 1.0 when there is no work at all."""
        work = self._work_values()
        total = float(sum(work))
        if total <= 0:
            return 1.0
        return float(max(work)) * len(work) / total

    @property
    def max_messages(self) -> int:
        return max(self.messages)


@dataclass(frozen=True)
class PlanStats(TrafficFigures):
    """Per-rank figures of a plan, forward and backward, reductions included."""

    forward_in: tuple[int, ...]
    forward_out: tuple[int, ...]
    backward_in: tuple[int, ...]
    backward_out: tuple[int, ...]
    # (all_to_all, peer) pairs with bytes > 0 that the rank sends, forward and backward
    messages: tuple[int, ...]
    work: tuple[int, ...]  # allowed (q, kv) elements the rank computes (one pass)
    # bytes received in stage transfers that no kernel on the receiver reads (ring's waste)
    unused_in: tuple[int, ...]
    num_collectives: int  # all_to_all_single calls per forward + backward
    num_kernels: tuple[int, ...]  # kernel calls per rank in one pass

    def _work_values(self) -> Sequence[float]:
        return self.work

    @property
    def max_work(self) -> int:
        return max(self.work)


@dataclass(frozen=True, eq=False)
class Plan:
    """A static context-parallel attention schedule (see the module docstring)."""

    scheme: str
    grid: BlockGrid = field(repr=False)
    layout: Layout = field(repr=False)
    shape: AttentionShape
    assignment: Mapping[tuple[int, int], int] = field(repr=False)
    forward: tuple[Stage, ...] = field(repr=False)
    forward_reduce: tuple[Transfer, ...] = field(repr=False)
    backward: tuple[Stage, ...] = field(repr=False)
    backward_reduce: tuple[Transfer, ...] = field(repr=False)
    info: Mapping[str, object] = field(default_factory=dict, repr=False)
    _cache: dict[str, PlanStats] = field(default_factory=dict, init=False, repr=False,
                                         compare=False)

    @property
    def num_ranks(self) -> int:
        return self.layout.num_ranks

    def kernels_of(self, rank: int) -> tuple[Kernel, ...]:
        """The forward kernels of ``rank`` in stage order (the backward runs the same)."""
        return tuple(k for stage in self.forward for k in stage.kernels if k.rank == rank)

    def transfer_bytes(self, transfer: Transfer) -> int:
        return self.shape.payload_bytes(transfer.kind, self.grid.block_len(transfer.block))

    def message_bytes(self, transfers: Sequence[Transfer]) -> dict[tuple[int, int], int]:
        """Bytes per (src, dst) of one all_to_all's transfers (pairs with no bytes absent)."""
        out: dict[tuple[int, int], int] = {}
        for t in transfers:
            key = (t.src, t.dst)
            out[key] = out.get(key, 0) + self.transfer_bytes(t)
        return out

    def stats(self) -> PlanStats:
        cached = self._cache.get("stats")
        if cached is None:
            cached = _compute_stats(self)
            self._cache["stats"] = cached
        return cached


def block_units(plan: Plan) -> float:
    """Bytes of one Q block of ``block_size`` tokens: the design note's traffic unit (§6.4),
    so ``stats.max_forward_inbound / block_units(plan)`` reads like its tables."""
    return float(plan.shape.payload_bytes("q", plan.grid.block_size))


# ----------------------------------------------------------------------------- helpers


def _fail(message: str, field_name: str = "plan") -> NoReturn:
    raise PlanError(field_name, message)


def _block_lens(grid: BlockGrid) -> IntArray:
    starts = np.arange(grid.num_blocks, dtype=np.int64) * grid.block_size
    return np.minimum(grid.block_size, grid.seq_len - starts).astype(np.int64)


def _bytes_table(plan: Plan) -> IntArray:
    """bytes[kind index, block] of one payload."""
    lens = _block_lens(plan.grid)
    per_token = np.array([plan.shape.token_elements(k) for k in PAYLOAD_KINDS], dtype=np.int64)
    table: IntArray = per_token[:, None] * lens[None, :] * plan.shape.itemsize
    return table


def _owners(layout: Layout, grid: BlockGrid, field_name: str) -> IntArray:
    if layout.num_blocks != grid.num_blocks or len(layout.owners) != grid.num_blocks:
        _fail(f"the layout has {len(layout.owners)} blocks but the grid has "
              f"{grid.num_blocks}", field_name)
    owners = np.asarray(layout.owners, dtype=np.int64)
    if owners.size and (owners.min() < 0 or owners.max() >= layout.num_ranks):
        _fail(f"layout owners must be ranks in [0, {layout.num_ranks})", field_name)
    return owners


def _assignment_arrays(grid: BlockGrid, num_ranks: int, assignment: Mapping[tuple[int, int], int],
                       field_name: str) -> tuple[IntArray, IntArray, IntArray]:
    """(rows, cols, ranks) of an assignment that covers exactly the non-empty blocks."""
    n = len(assignment)
    keys = list(assignment.keys())
    if sum(map(len, keys)) != 2 * n:
        _fail("assignment keys must be (q block, kv block) pairs", field_name)
    flat = np.fromiter(itertools.chain.from_iterable(keys), dtype=np.int64, count=2 * n)
    rows, cols = flat[0::2], flat[1::2]
    ranks = np.fromiter(assignment.values(), dtype=np.int64, count=n)
    p = grid.num_blocks
    if n and (min(rows.min(), cols.min()) < 0 or max(rows.max(), cols.max()) >= p):
        _fail(f"assignment blocks must be in [0, {p})", field_name)
    if n and (ranks.min() < 0 or ranks.max() >= num_ranks):
        _fail(f"assignment ranks must be in [0, {num_ranks})", field_name)
    empty = grid.kinds[rows, cols] == EMPTY
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        _fail(f"assignment has the empty block ({rows[i]}, {cols[i]})", field_name)
    num_nonempty = int(np.count_nonzero(grid.kinds != EMPTY))
    if n != num_nonempty:
        covered = np.zeros((p, p), dtype=bool)
        covered[rows, cols] = True
        missing = np.argwhere((grid.kinds != EMPTY) & ~covered)
        r, c = (int(v) for v in missing[0])
        _fail(f"assignment must cover every non-empty block: ({r}, {c}) is missing "
              f"({n} of {num_nonempty} assigned)", field_name)
    return rows, cols, ranks


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise PlanError("granularity", f"must be one of {', '.join(GRANULARITIES)}, "
                                       f"got {granularity!r}")


def _make_kernels(grid: BlockGrid, rows: IntArray, cols: IntArray, ranks: IntArray,
                  stages: IntArray, num_stages: int, granularity: str
                  ) -> list[tuple[Kernel, ...]]:
    """Kernels per stage, ordered by (rank, q block, kv block); "row" fuses the blocks of
    one q row on one rank in one stage into one call (design note §2.5)."""
    order = np.lexsort((cols, rows, ranks, stages))
    rows, cols, ranks, stages = rows[order], cols[order], ranks[order], stages[order]
    full = grid.kinds[rows, cols] == FULL
    counts = grid.counts[rows, cols].astype(np.int64)
    n = rows.size
    if n == 0:
        return [() for _ in range(num_stages)]
    if granularity == "block":
        singles = [(b,) for b in range(grid.num_blocks)]
        kernels = list(map(Kernel, ranks.tolist(), [singles[r] for r in rows.tolist()],
                           [singles[c] for c in cols.tolist()], full.tolist(),
                           counts.tolist()))
        group_stage = stages
    else:
        change = np.ones(n, dtype=bool)
        change[1:] = ((stages[1:] != stages[:-1]) | (ranks[1:] != ranks[:-1])
                      | (rows[1:] != rows[:-1]))
        starts = np.flatnonzero(change)
        ends = np.append(starts[1:], n)
        elements = np.add.reduceat(counts, starts)
        all_full = np.logical_and.reduceat(full, starts)
        cols_list = cols.tolist()
        kernels = [Kernel(g, (r,), tuple(cols_list[a:b]), f, e) for g, r, a, b, f, e in
                   zip(ranks[starts].tolist(), rows[starts].tolist(), starts.tolist(),
                       ends.tolist(), all_full.tolist(), elements.tolist())]
        group_stage = stages[starts]
    bounds = np.searchsorted(group_stage, np.arange(num_stages + 1)).tolist()
    return [tuple(kernels[bounds[s]:bounds[s + 1]]) for s in range(num_stages)]


def _make_transfers(stages: IntArray, src: IntArray, dst: IntArray, kinds: IntArray,
                    blocks: IntArray, num_stages: int) -> list[tuple[Transfer, ...]]:
    """Transfers per stage, ordered by (src, dst, kind, block)."""
    order = np.lexsort((blocks, kinds, dst, src, stages))
    transfers = transfer_objects(src[order], dst[order], kinds[order], blocks[order])
    bounds = np.searchsorted(stages[order], np.arange(num_stages + 1)).tolist()
    return [tuple(transfers[bounds[s]:bounds[s + 1]]) for s in range(num_stages)]


_KIND_NAMES = np.array(PAYLOAD_KINDS, dtype=object)


def transfer_objects(src: IntArray, dst: IntArray, kinds: IntArray, blocks: IntArray
                     ) -> list[Transfer]:
    """`Transfer`s from parallel arrays (kind as an index into PAYLOAD_KINDS), in order."""
    return list(map(Transfer, src.tolist(), dst.tolist(), _KIND_NAMES[kinds].tolist(),
                    blocks.tolist()))


def _reduce_transfers(pairs: Sequence[tuple[IntArray, IntArray, IntArray, int]]
                      ) -> tuple[Transfer, ...]:
    """One stage of (src, dst, block, kind index) groups, ordered like a stage."""
    if not pairs:
        return ()
    src = np.concatenate([p[0] for p in pairs])
    dst = np.concatenate([p[1] for p in pairs])
    blocks = np.concatenate([p[2] for p in pairs])
    kinds = np.concatenate([np.full(p[0].size, p[3], dtype=np.int64) for p in pairs])
    return _make_transfers(np.zeros(src.size, dtype=np.int64), src, dst, kinds, blocks, 1)[0]


def _remote_pairs(ranks: IntArray, blocks: IntArray, owners: IntArray, num_blocks: int
                  ) -> tuple[IntArray, IntArray]:
    """The distinct (rank, block) with rank != owner(block), as (ranks, blocks)."""
    remote = owners[blocks] != ranks
    keys = np.unique(ranks[remote] * num_blocks + blocks[remote])
    return keys // num_blocks, keys % num_blocks


def _assemble(scheme: str, grid: BlockGrid, layout: Layout, shape: AttentionShape,
              assignment: Mapping[tuple[int, int], int], kernels: list[tuple[Kernel, ...]],
              forward_transfers: list[tuple[Transfer, ...]],
              backward_transfers: list[tuple[Transfer, ...]],
              forward_reduce: tuple[Transfer, ...], backward_reduce: tuple[Transfer, ...],
              info: Mapping[str, object]) -> Plan:
    forward = tuple(Stage(t, k) for t, k in zip(forward_transfers, kernels))
    if backward_transfers is forward_transfers:
        backward = forward
    else:
        backward = tuple(Stage(t, k) for t, k in zip(backward_transfers, kernels))
    return Plan(scheme=scheme, grid=grid, layout=layout, shape=shape, assignment=assignment,
                forward=forward, forward_reduce=forward_reduce, backward=backward,
                backward_reduce=backward_reduce, info=dict(info))


# ----------------------------------------------------------------------------- build


def build_plan(scheme: str, grid: BlockGrid, layout: Layout, shape: AttentionShape,
               assignment: Mapping[tuple[int, int], int], *, granularity: str = "block",
               staging: str = "distance", info: Mapping[str, object] | None = None) -> Plan:
    """The direct plan of an assignment: every payload a rank needs comes straight from its
    owner, in stage ``d = (dst - src) mod CP`` (one peer per rank per stage, like a ring
    step; stages without transfers are dropped) or, with ``staging="single"``, all in one
    exchange; a kernel runs in the earliest stage after which all its inputs are held. The
    backward re-fetches q_bwd and kv the same way.
    """
    _check_granularity(granularity)
    if staging not in STAGINGS:
        raise PlanError("staging", f"must be one of {', '.join(STAGINGS)}, got {staging!r}")
    owners = _owners(layout, grid, "layout")
    num_ranks, p = layout.num_ranks, grid.num_blocks
    rows, cols, ranks = _assignment_arrays(grid, num_ranks, assignment, "assignment")

    q_rank, q_block = _remote_pairs(ranks, rows, owners, p)
    kv_rank, kv_block = _remote_pairs(ranks, cols, owners, p)
    src = np.concatenate([owners[q_block], owners[kv_block]])
    dst = np.concatenate([q_rank, kv_rank])
    blocks = np.concatenate([q_block, kv_block])
    kinds = np.concatenate([np.full(q_block.size, _Q, dtype=np.int64),
                            np.full(kv_block.size, _KV, dtype=np.int64)])
    distance = (dst - src) % num_ranks
    present = np.unique(distance)
    stage_of_distance = np.full(num_ranks, -1, dtype=np.int64)
    stage_of_distance[0] = 0
    stage_of_distance[present] = np.arange(1, present.size + 1)
    num_stages = 1 + present.size
    if staging == "single":
        stage_of_distance[1:] = 1
        num_stages = 1 + min(present.size, 1)

    kernel_distance = np.maximum((ranks - owners[rows]) % num_ranks,
                                 (ranks - owners[cols]) % num_ranks)
    kernels = _make_kernels(grid, rows, cols, ranks, stage_of_distance[kernel_distance],
                            num_stages, granularity)
    transfer_stage = stage_of_distance[distance]
    forward_transfers = _make_transfers(transfer_stage, src, dst, kinds, blocks, num_stages)
    bwd_kinds = np.where(kinds == _Q, _Q_BWD, kinds)
    backward_transfers = _make_transfers(transfer_stage, src, dst, bwd_kinds, blocks,
                                         num_stages)
    # a rank computing in a row it does not own returns a partial per row (out, then dq);
    # one computing in a column it does not own returns a dkv partial
    forward_reduce = _reduce_transfers([(q_rank, owners[q_block], q_block, _OUT)]
                                       if q_rank.size else [])
    backward_groups = []
    if q_rank.size:
        backward_groups.append((q_rank, owners[q_block], q_block, _DQ))
    if kv_rank.size:
        backward_groups.append((kv_rank, owners[kv_block], kv_block, _DKV))
    backward_reduce = _reduce_transfers(backward_groups)
    plan_info: dict[str, object] = {"layout": layout.kind, "granularity": granularity,
                                    "staging": staging}
    plan_info.update(info or {})
    return _assemble(scheme, grid, layout, shape, assignment, kernels, forward_transfers,
                     backward_transfers, forward_reduce, backward_reduce, plan_info)


def owner_computes_plan(scheme: str, grid: BlockGrid, layout: Layout, shape: AttentionShape,
                        stage_transfers: list[tuple[Transfer, ...]], kernel_stage: IntArray,
                        *, granularity: str, info: Mapping[str, object]) -> Plan:
    """A plan in which the owner of each row computes it, with the given forward stage
    transfers (kv only; the backward repeats them) and the stage of each non-empty block
    (row-major order of ``np.nonzero``); the dkv partials go back to the kv owners."""
    _check_granularity(granularity)
    owners = _owners(layout, grid, "layout")
    rows, cols = (a.astype(np.int64) for a in np.nonzero(grid.kinds != EMPTY))
    ranks = owners[rows]
    kernels = _make_kernels(grid, rows, cols, ranks, kernel_stage, len(stage_transfers),
                            granularity)
    assignment = dict(zip(zip(rows.tolist(), cols.tolist()), ranks.tolist()))
    kv_rank, kv_block = _remote_pairs(ranks, cols, owners, grid.num_blocks)
    backward_reduce = _reduce_transfers([(kv_rank, owners[kv_block], kv_block, _DKV)]
                                        if kv_rank.size else [])
    plan_info: dict[str, object] = {"layout": layout.kind, "granularity": granularity,
                                    "assigner": "owner_computes"}
    plan_info.update(info)
    return _assemble(scheme, grid, layout, shape, assignment, kernels, stage_transfers,
                     stage_transfers, (), backward_reduce, plan_info)


# ----------------------------------------------------------------------------- stats


def _transfer_arrays(transfers: Sequence[Transfer], num_ranks: int, num_blocks: int
                     ) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    n = len(transfers)
    src = np.fromiter(map(_SRC, transfers), dtype=np.int64, count=n)
    dst = np.fromiter(map(_DST, transfers), dtype=np.int64, count=n)
    blocks = np.fromiter(map(_BLOCK, transfers), dtype=np.int64, count=n)
    try:
        kinds = np.fromiter(map(_KIND_INDEX.__getitem__, map(_KIND, transfers)),
                            dtype=np.int64, count=n)
    except KeyError as exc:
        _fail(f"transfer kind {exc.args[0]!r} is not one of {', '.join(PAYLOAD_KINDS)}")
    if n and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_ranks):
        _fail(f"transfer ranks must be in [0, {num_ranks})")
    if n and (blocks.min() < 0 or blocks.max() >= num_blocks):
        _fail(f"transfer blocks must be in [0, {num_blocks})")
    return src, dst, kinds, blocks


_SRC, _DST, _KIND, _BLOCK = (attrgetter(name) for name in ("src", "dst", "kind", "block"))
_RANK, _Q_BLOCKS, _KV_BLOCKS, _ELEMENTS, _FULL = (
    attrgetter(name) for name in ("rank", "q_blocks", "kv_blocks", "elements", "full"))


def _kernel_arrays(kernels: Sequence[Kernel]) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """(kernel index, rank, q block, kv block) of every block pair the kernels cover."""
    n = len(kernels)
    q_blocks = list(map(_Q_BLOCKS, kernels))
    if all(len(q) == 1 for q in q_blocks):
        kv_blocks = list(map(_KV_BLOCKS, kernels))
        widths = np.fromiter(map(len, kv_blocks), dtype=np.int64, count=n)
        index_1 = np.repeat(np.arange(n, dtype=np.int64), widths)
        ranks_1 = np.fromiter(map(_RANK, kernels), dtype=np.int64, count=n)[index_1]
        rows_1 = np.fromiter(itertools.chain.from_iterable(q_blocks), dtype=np.int64,
                             count=n)[index_1]
        cols_1 = np.fromiter(itertools.chain.from_iterable(kv_blocks), dtype=np.int64,
                             count=int(widths.sum()))
        return index_1, ranks_1, rows_1, cols_1
    index: list[int] = []
    ranks: list[int] = []
    rows: list[int] = []
    cols: list[int] = []
    for i, k in enumerate(kernels):
        if len(k.q_blocks) == 1 and len(k.kv_blocks) == 1:
            index.append(i)
            ranks.append(k.rank)
            rows.append(k.q_blocks[0])
            cols.append(k.kv_blocks[0])
            continue
        for r in k.q_blocks:
            for c in k.kv_blocks:
                index.append(i)
                ranks.append(k.rank)
                rows.append(r)
                cols.append(c)
    return (np.array(index, dtype=np.int64), np.array(ranks, dtype=np.int64),
            np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64))


def _pass_stats(plan: Plan, stages: tuple[Stage, ...], reduce: tuple[Transfer, ...],
                row_kind: int, table: IntArray, messages: IntArray
                ) -> tuple[IntArray, IntArray, IntArray]:
    """(bytes in, bytes out, unused bytes in) per rank of one pass; adds its messages."""
    num_ranks, p = plan.num_ranks, plan.grid.num_blocks
    inbound = np.zeros(num_ranks, dtype=np.int64)
    outbound = np.zeros(num_ranks, dtype=np.int64)
    unused = np.zeros(num_ranks, dtype=np.int64)
    q_read = np.zeros((num_ranks, p), dtype=bool)
    kv_read = np.zeros((num_ranks, p), dtype=bool)
    for stage in stages:
        _, ranks, rows, cols = _kernel_arrays(stage.kernels)
        if ranks.size and (ranks.min() < 0 or ranks.max() >= num_ranks):
            _fail(f"kernel ranks must be in [0, {num_ranks})")
        q_read[ranks, rows] = True
        kv_read[ranks, cols] = True
    groups = [(stage.transfers, False) for stage in stages if stage.transfers]
    if reduce:
        groups.append((reduce, True))
    for transfers, is_reduce in groups:
        src, dst, kinds, blocks = _transfer_arrays(transfers, num_ranks, p)
        nbytes = table[kinds, blocks]
        np.add.at(inbound, dst, nbytes)
        np.add.at(outbound, src, nbytes)
        pairs = np.sort(src[nbytes > 0] * num_ranks + dst[nbytes > 0])
        distinct = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if pairs.size else pairs
        messages += np.bincount(distinct // num_ranks, minlength=num_ranks)
        if is_reduce:  # partials are merged, never "unused"
            continue
        read = np.where(kinds == row_kind, q_read[dst, blocks],
                        np.where(kinds == _KV, kv_read[dst, blocks], True))
        np.add.at(unused, dst[~read], nbytes[~read])
    return inbound, outbound, unused


def _compute_stats(plan: Plan) -> PlanStats:
    num_ranks = plan.num_ranks
    table = _bytes_table(plan)
    messages = np.zeros(num_ranks, dtype=np.int64)
    f_in, f_out, f_unused = _pass_stats(plan, plan.forward, plan.forward_reduce, _Q, table,
                                        messages)
    b_in, b_out, b_unused = _pass_stats(plan, plan.backward, plan.backward_reduce, _Q_BWD,
                                        table, messages)
    work = np.zeros(num_ranks, dtype=np.int64)
    num_kernels = np.zeros(num_ranks, dtype=np.int64)
    for stage in plan.forward:
        ranks = np.fromiter(map(_RANK, stage.kernels), dtype=np.int64,
                            count=len(stage.kernels))
        elements = np.fromiter(map(_ELEMENTS, stage.kernels), dtype=np.int64,
                               count=len(stage.kernels))
        np.add.at(work, ranks, elements)
        np.add.at(num_kernels, ranks, 1)
    num_collectives = (sum(1 for s in plan.forward if s.transfers)
                       + sum(1 for s in plan.backward if s.transfers)
                       + int(bool(plan.forward_reduce)) + int(bool(plan.backward_reduce)))

    def ints(a: IntArray) -> tuple[int, ...]:
        return tuple(int(v) for v in a.tolist())

    return PlanStats(forward_in=ints(f_in), forward_out=ints(f_out), backward_in=ints(b_in),
                     backward_out=ints(b_out), messages=ints(messages), work=ints(work),
                     unused_in=ints(f_unused + b_unused), num_collectives=num_collectives,
                     num_kernels=ints(num_kernels))


# ----------------------------------------------------------------------------- check


def _first(mask: BoolArray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_pass(plan: Plan, name: str, stages: tuple[Stage, ...], row_kind: int,
                owners: IntArray, assigned: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Checks one pass; returns (rank, q block, kv block) of every computed block pair."""
    grid = plan.grid
    num_ranks, p = plan.num_ranks, grid.num_blocks
    row_name = PAYLOAD_KINDS[row_kind]
    if not stages:
        _fail(f"the {name} has no stages (stage 0 holds the local kernels)")
    held = {kind: np.zeros((num_ranks, p), dtype=bool) for kind in (row_kind, _KV)}
    for table in held.values():
        table[owners, np.arange(p)] = True
    cover = np.zeros((p, p), dtype=np.int64)
    all_ranks, all_rows, all_cols = [], [], []
    for s, stage in enumerate(stages):
        where = f"{name} stage {s}"
        if s == 0 and stage.transfers:
            _fail(f"{where} must have no transfers (it runs on local data)")
        if s > 0 and not stage.transfers:
            _fail(f"{where} has no transfers (a stage exists only if some rank sends)")
        if stage.transfers:
            src, dst, kinds, blocks = _transfer_arrays(stage.transfers, num_ranks, p)
            bad = (kinds != row_kind) & (kinds != _KV)
            if bad.any():
                _fail(f"{where} carries {stage.transfers[_first(bad)]}: only {row_name} and "
                      f"kv move in the {name}")
            if (src == dst).any():
                _fail(f"{where} sends {stage.transfers[_first(src == dst)]} to itself")
            for kind, table in held.items():
                sel = np.flatnonzero(kinds == kind)
                if not sel.size:
                    continue
                missing = ~table[src[sel], blocks[sel]]
                if missing.any():
                    t = stage.transfers[int(sel[_first(missing)])]
                    _fail(f"{where} sends {t}, which rank {t.src} does not hold before "
                          f"stage {s}")
                again = table[dst[sel], blocks[sel]]
                keys = dst[sel] * p + blocks[sel]
                _, first_index = np.unique(keys, return_index=True)
                duplicate = np.ones(sel.size, dtype=bool)
                duplicate[first_index] = False
                if (again | duplicate).any():
                    t = stage.transfers[int(sel[_first(again | duplicate)])]
                    _fail(f"{where}: rank {t.dst} receives {t.kind} block {t.block} twice")
            for kind, table in held.items():
                sel = kinds == kind
                table[dst[sel], blocks[sel]] = True
        index, ranks, rows, cols = _kernel_arrays(stage.kernels)
        if not index.size:
            continue
        if ranks.min() < 0 or ranks.max() >= num_ranks:
            _fail(f"{where}: kernel ranks must be in [0, {num_ranks})")
        if min(rows.min(), cols.min()) < 0 or max(rows.max(), cols.max()) >= p:
            _fail(f"{where}: kernel blocks must be in [0, {p})")
        for kind, blocks_read in ((row_kind, rows), (_KV, cols)):
            missing = ~held[kind][ranks, blocks_read]
            if missing.any():
                i = _first(missing)
                _fail(f"{where}: {stage.kernels[index[i]]} reads {PAYLOAD_KINDS[kind]} block "
                      f"{blocks_read[i]}, which rank {ranks[i]} does not hold by then")
        empty = grid.kinds[rows, cols] == EMPTY
        if empty.any():
            i = _first(empty)
            _fail(f"{where}: {stage.kernels[index[i]]} covers the empty block "
                  f"({rows[i]}, {cols[i]})")
        wrong = assigned[rows, cols] != ranks
        if wrong.any():
            i = _first(wrong)
            _fail(f"{where}: block ({rows[i]}, {cols[i]}) is assigned to rank "
                  f"{assigned[rows[i], cols[i]]} but computed on rank {ranks[i]}")
        np.add.at(cover, (rows, cols), 1)
        counts = grid.counts[rows, cols].astype(np.int64)
        elements = np.zeros(len(stage.kernels), dtype=np.int64)
        np.add.at(elements, index, counts)
        full = np.ones(len(stage.kernels), dtype=bool)
        np.logical_and.at(full, index, grid.kinds[rows, cols] == FULL)
        claimed = np.fromiter(map(_ELEMENTS, stage.kernels), dtype=np.int64,
                              count=len(stage.kernels))
        claimed_full = np.fromiter(map(_FULL, stage.kernels), dtype=bool,
                                   count=len(stage.kernels))
        if (claimed != elements).any():
            i = _first(claimed != elements)
            _fail(f"{where}: {stage.kernels[i]} claims {claimed[i]} elements, the grid "
                  f"counts {elements[i]}")
        if (claimed_full != full).any():
            i = _first(claimed_full != full)
            _fail(f"{where}: {stage.kernels[i]} has full={bool(claimed_full[i])} but its "
                  f"blocks are {'all' if full[i] else 'not all'} FULL")
        all_ranks.append(ranks)
        all_rows.append(rows)
        all_cols.append(cols)
    nonempty = grid.kinds != EMPTY
    wrong_cover = (cover != nonempty.astype(np.int64))
    if wrong_cover.any():
        r, c = (int(v) for v in np.argwhere(wrong_cover)[0])
        _fail(f"the {name} computes block ({r}, {c}) {cover[r, c]} times; every non-empty "
              f"block exactly once, empty ones never")
    if not all_ranks:
        empty_array = np.zeros(0, dtype=np.int64)
        return empty_array, empty_array, empty_array
    return np.concatenate(all_ranks), np.concatenate(all_rows), np.concatenate(all_cols)


def _check_reduce(plan: Plan, name: str, transfers: tuple[Transfer, ...],
                  expected: dict[int, tuple[IntArray, IntArray]], owners: IntArray) -> None:
    """``expected``: kind index -> (computing ranks, blocks) of the partials that exist
    (duplicates allowed, the owner's own included); each must reach the owner once."""
    num_ranks, p = plan.num_ranks, plan.grid.num_blocks
    src, dst, kinds, blocks = _transfer_arrays(transfers, num_ranks, p)
    allowed = set(expected)
    bad = ~np.isin(kinds, list(allowed))
    if bad.any():
        _fail(f"{name} carries {transfers[_first(bad)]}: only "
              f"{', '.join(PAYLOAD_KINDS[k] for k in sorted(allowed))} are reduced there")
    wrong_dst = dst != owners[blocks]
    if wrong_dst.any():
        t = transfers[_first(wrong_dst)]
        _fail(f"{name} sends {t} to rank {t.dst}, not to the block's owner "
              f"{owners[t.block]}")
    for kind, (ranks, kind_blocks) in expected.items():
        remote = owners[kind_blocks] != ranks
        want = np.unique(ranks[remote] * p + kind_blocks[remote])
        sel = kinds == kind
        have = src[sel] * p + blocks[sel]
        have_unique = np.unique(have)
        if have_unique.size != have.size:
            _fail(f"{name} sends a {PAYLOAD_KINDS[kind]} partial twice")
        if not np.array_equal(want, have_unique):
            extra = np.setdiff1d(have_unique, want)
            lost = np.setdiff1d(want, have_unique)
            if lost.size:
                g, b = divmod(int(lost[0]), p)
                _fail(f"{name} drops the {PAYLOAD_KINDS[kind]} partial of block {b} "
                      f"computed on rank {g}")
            g, b = divmod(int(extra[0]), p)
            _fail(f"{name} sends a {PAYLOAD_KINDS[kind]} partial of block {b} from rank {g}, "
                  f"which computed none there")


def check_plan(plan: Plan) -> None:
    """Raises PlanError (field "plan") unless the plan follows the execution semantics of
    the module docstring: every non-empty block computed exactly once per pass by its
    assigned rank, no empty block covered, every kernel's inputs and every transfer's
    payload held in time, nothing received twice, and the reductions carrying exactly the
    partials that exist, to their owners."""
    grid, layout = plan.grid, plan.layout
    if layout.num_ranks < 1:
        _fail("the layout has no ranks")
    owners = _owners(layout, grid, "plan")
    p = grid.num_blocks
    rows, cols, ranks = _assignment_arrays(grid, layout.num_ranks, plan.assignment, "plan")
    assigned = np.full((p, p), -1, dtype=np.int64)
    assigned[rows, cols] = ranks
    f_ranks, f_rows, _ = _check_pass(plan, "forward", plan.forward, _Q, owners, assigned)
    _check_reduce(plan, "forward_reduce", plan.forward_reduce, {_OUT: (f_ranks, f_rows)},
                  owners)
    b_ranks, b_rows, b_cols = _check_pass(plan, "backward", plan.backward, _Q_BWD, owners,
                                          assigned)
    _check_reduce(plan, "backward_reduce", plan.backward_reduce,
                  {_DQ: (b_ranks, b_rows), _DKV: (b_ranks, b_cols)}, owners)
