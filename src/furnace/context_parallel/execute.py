"""The runtime of UltraAttn's plans: exact forward and backward of any context-parallel plan.

UltraAttn (Yang et al., SC'25) executes a static plan of compute kernels and messages
(design note §2.5-2.6); its released code leaves the LSE-correct merge out (§2.8). This
module runs any `Plan` of `plan.py` exactly, forward and backward, as one
`torch.autograd.Function`:

- Forward (design note §6.1 item 5): one ``all_to_all_single`` per stage that has
  transfers, on one flat 1-D buffer: for each destination rank in order, its transfers in
  plan order, each payload flattened. The exchange of stage s+1 is posted (``async_op``)
  as soon as stage s has arrived and before stage s's kernels run, so communication
  overlaps compute one stage ahead; it cannot be posted earlier, because a plan may forward
  in stage s+1 what arrived in stage s (ring attention does). Each kernel's partial
  (out, lse) is merged into its q block's accumulator (§2.7), then one exchange carries
  every partial to its row's owner, which merges them.
- Backward (§2.7): owners compute delta = rowsum(dout * out); the backward stages carry
  (q, dout, lse, delta) and (k, v) as the plan says, with the same one-stage-ahead overlap;
  every kernel runs `block_backward` with its rows' global lse and delta; one exchange sends
  the dq partials to the q owners and the dk/dv partials to the kv owners, which sum them.
  Nothing received in the forward is kept: the backward fetches again, which is what the
  plan's byte counts model.

Every rank walks the same plan, so every rank issues the same collectives in the same
order (a stage exists only if some rank sends in it), and the bytes the `Communicator`
logs are the plan's `PlanStats` exactly. A plan is vouched for by `plan.check_plan` the
first time it runs; every rank checks the same plan, so a broken one fails everywhere
before the first collective instead of leaving the other ranks waiting in one.

A rank that computes blocks of a row it does not own has that row's dout, lse and delta
but not its out (the plan's q_bwd payload). The fused CPU backward derives delta from an
``out`` argument, so such a rank passes a stand-in with the same rowsum(dout * out)
(`_stand_in_out`); for half types, whose rounding cannot hold that sum closely enough, it
takes the masked path, which reads delta directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from furnace.runtime.comm import CommHandle, Communicator

from .config import PlanError
from .kernels import block_backward, block_forward, lse_dtype, merge_partial
from .layout import local_positions, shard
from .masks import BlockGrid
from .plan import AttentionShape, Kernel, Plan, Stage, Transfer, check_plan

__all__ = ["ContextParallelAttention", "context_parallel_attention", "default_scale"]

# the tensors of each payload kind, in buffer order: (heads, with a head_dim axis)
# "q": q; "kv": k, v; "out": partial out, its lse; "q_bwd": q, dout, lse, delta;
# "dq": dq; "dkv": dk, dv
_PAYLOAD_PARTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "q": (("q", True),),
    "kv": (("kv", True), ("kv", True)),
    "out": (("q", True), ("q", False)),
    "q_bwd": (("q", True), ("q", True), ("q", False), ("q", False)),
    "dq": (("q", True),),
    "dkv": (("kv", True), ("kv", True)),
}
_FORWARD_KINDS = frozenset({"q", "kv"})
_BACKWARD_KINDS = frozenset({"q_bwd", "kv"})

Payload = tuple[Tensor, ...]


def default_scale(head_dim: int) -> float:
    """The softmax scale when none is given: head_dim ** -0.5."""
    # the same expression as the kernels' default, so both give the identical float
    return cast(float, head_dim ** -0.5)


@dataclass(frozen=True)
class _Dims:
    """The per-token sizes the buffers are cut by."""

    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def part_shapes(self, kind: str, tokens: int) -> tuple[tuple[int, ...], ...]:
        shapes = []
        for heads, with_dim in _PAYLOAD_PARTS[kind]:
            h = self.num_heads if heads == "q" else self.num_kv_heads
            shapes.append((self.batch, h, tokens, self.head_dim) if with_dim
                          else (self.batch, h, tokens))
        return tuple(shapes)

    def numel(self, kind: str, tokens: int) -> int:
        total = 0
        for shape in self.part_shapes(kind, tokens):
            n = 1
            for s in shape:
                n *= s
            total += n
        return total


@dataclass(frozen=True)
class _Exchange:
    """One ``all_to_all_single`` as this rank sees it: what goes out, in buffer order, and
    what comes in, in buffer order (by source rank, each source's transfers in plan order)."""

    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]


@dataclass
class _Posted:
    exchange: _Exchange
    handle: CommHandle[Tensor]


@dataclass(frozen=True)
class _Schedule:
    """Everything one rank needs to run a plan, computed once per (plan, rank). It holds
    the plan's grid and shape, not the plan, so that the cache keyed by the plan can let
    the plan go."""

    grid: BlockGrid
    shape: AttentionShape
    rank: int
    dims: _Dims
    own_blocks: tuple[int, ...]
    # the token range of each own block inside this rank's local tensors
    local_slices: dict[int, slice]
    local_tokens: int
    block_lens: tuple[int, ...]
    forward: tuple[_Exchange | None, ...]
    forward_kernels: tuple[tuple[Kernel, ...], ...]
    forward_reduce: _Exchange | None
    backward: tuple[_Exchange | None, ...]
    backward_kernels: tuple[tuple[Kernel, ...], ...]
    backward_reduce: _Exchange | None
    _tokens: dict[tuple[int, str], Tensor] = field(default_factory=dict, compare=False)

    @classmethod
    def build(cls, plan: Plan, rank: int) -> _Schedule:
        grid, layout, shape = plan.grid, plan.layout, plan.shape
        dims = _Dims(shape.batch, shape.num_heads, shape.num_kv_heads, shape.head_dim)
        block_lens = tuple(grid.block_len(b) for b in range(grid.num_blocks))
        own = tuple(layout.blocks_of(rank))
        slices: dict[int, slice] = {}
        start = 0
        for b in own:
            slices[b] = slice(start, start + block_lens[b])
            start += block_lens[b]
        num_ranks = plan.num_ranks

        def exchange(transfers: Sequence[Transfer], allowed: frozenset[str],
                     where: str) -> _Exchange | None:
            if not transfers:
                return None
            sends: list[list[Transfer]] = [[] for _ in range(num_ranks)]
            recvs: list[list[Transfer]] = [[] for _ in range(num_ranks)]
            for t in transfers:
                if t.kind not in allowed:
                    raise PlanError("plan", f"{where} carries only {sorted(allowed)} "
                                    f"payloads; got a {t.kind!r} transfer")
                if t.src == t.dst or not (0 <= t.src < num_ranks and 0 <= t.dst < num_ranks):
                    raise PlanError("plan", f"transfers between distinct ranks in "
                                    f"0..{num_ranks - 1}; {where} has {t.src} -> {t.dst}")
                if t.src == rank:
                    sends[t.dst].append(t)
                if t.dst == rank:
                    recvs[t.src].append(t)
            return _Exchange(
                sends=tuple(t for per in sends for t in per),
                recvs=tuple(t for per in recvs for t in per),
                send_splits=tuple(sum(dims.numel(t.kind, block_lens[t.block]) for t in per)
                                  for per in sends),
                recv_splits=tuple(sum(dims.numel(t.kind, block_lens[t.block]) for t in per)
                                  for per in recvs))

        def stages(seq: Sequence[Stage], allowed: frozenset[str], what: str) -> tuple[
                tuple[_Exchange | None, ...], tuple[tuple[Kernel, ...], ...]]:
            exchanges = tuple(exchange(st.transfers, allowed, f"{what} stage {i}")
                              for i, st in enumerate(seq))
            kernels = tuple(tuple(k for k in st.kernels if k.rank == rank) for st in seq)
            return exchanges, kernels

        fwd, fwd_kernels = stages(plan.forward, _FORWARD_KINDS, "forward")
        bwd, bwd_kernels = stages(plan.backward, _BACKWARD_KINDS, "backward")
        return cls(
            grid=grid, shape=shape, rank=rank, dims=dims, own_blocks=own, local_slices=slices,
            local_tokens=start, block_lens=block_lens,
            forward=fwd, forward_kernels=fwd_kernels,
            forward_reduce=exchange(plan.forward_reduce, frozenset({"out"}), "forward_reduce"),
            backward=bwd, backward_kernels=bwd_kernels,
            backward_reduce=exchange(plan.backward_reduce, frozenset({"dq", "dkv"}),
                                     "backward_reduce"))

    def tokens(self, blocks: Sequence[int], device: torch.device) -> Tensor:
        """The global token ids of ``blocks`` concatenated (cached per block and device)."""
        parts = []
        for b in blocks:
            key = (b, str(device))
            ids = self._tokens.get(key)
            if ids is None:
                ids = self.grid.block_tokens(b).to(device=device, dtype=torch.long)
                self._tokens[key] = ids
            parts.append(ids)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class _Runner:
    """One call's forward and backward on one rank."""

    def __init__(self, schedule: _Schedule, comm: Communicator, scale: float) -> None:
        self.schedule = schedule
        self.comm = comm
        self.scale = scale
        self.mask_mod = schedule.grid.mask_mod
        # the dtype of the row statistics (lse, delta) the kernels work with
        self.row_dtype = lse_dtype(schedule.shape.torch_dtype)

    # --- the exchanges ---------------------------------------------------------------

    def _post(self, exchange: _Exchange | None, payload: Callable[[Transfer], Payload],
              like: Tensor) -> _Posted | None:
        if exchange is None:
            return None
        # one buffer in the compute dtype: an lse or delta kept in fp32 for a half type
        # travels in that type, as the plan's byte counts assume
        pieces = [part.reshape(-1).to(like.dtype) for t in exchange.sends
                  for part in payload(t)]
        flat = (torch.cat(pieces) if pieces
                else torch.empty(0, dtype=like.dtype, device=like.device))
        handle = self.comm.all_to_all_single(flat, list(exchange.recv_splits),
                                             list(exchange.send_splits), async_op=True)
        return _Posted(exchange, handle)

    def _wait(self, posted: _Posted | None) -> list[tuple[Transfer, Payload]]:
        if posted is None:
            return []
        flat = posted.handle.wait()
        dims, lens = self.schedule.dims, self.schedule.block_lens
        received: list[tuple[Transfer, Payload]] = []
        offset = 0
        for t in posted.exchange.recvs:
            parts = []
            for shape in dims.part_shapes(t.kind, lens[t.block]):
                n = 1
                for s in shape:
                    n *= s
                part = flat[offset:offset + n].view(shape)
                parts.append(part if len(shape) == 4 else part.to(self.row_dtype))
                offset += n
            received.append((t, tuple(parts)))
        if offset != flat.numel():
            raise RuntimeError(f"rank {self.schedule.rank}: received {flat.numel()} elements, "
                               f"the plan accounts for {offset}")
        return received

    def _run_stages(self, exchanges: Sequence[_Exchange | None],
                    kernels: Sequence[Sequence[Kernel]], payload: Callable[[Transfer], Payload],
                    store: Callable[[Transfer, Payload], None],
                    compute: Callable[[Kernel, int], None], like: Tensor) -> None:
        """The stage loop shared by forward and backward: wait for stage s, post stage s+1,
        compute stage s."""
        pending = self._post(exchanges[0], payload, like) if exchanges else None
        for s in range(len(exchanges)):
            for t, p in self._wait(pending):
                store(t, p)
            pending = (self._post(exchanges[s + 1], payload, like)
                       if s + 1 < len(exchanges) else None)
            for kernel in kernels[s]:
                compute(kernel, s)

    # unreachable for a plan that check_plan accepted; kept so that no gap in the plan
    # (or in this module) can turn into a silently wrong result
    def _missing(self, what: str, block: int, where: str) -> PlanError:
        return PlanError("plan", f"a plan in which every input is held when it is used; rank "
                         f"{self.schedule.rank} needs {what} of block {block} in {where} "
                         "but does not hold it")

    # --- forward ---------------------------------------------------------------------

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        sch = self.schedule
        held_q: dict[int, Tensor] = {b: q[:, :, sl] for b, sl in sch.local_slices.items()}
        held_kv: dict[int, tuple[Tensor, Tensor]] = {
            b: (k[:, :, sl], v[:, :, sl]) for b, sl in sch.local_slices.items()}
        acc: dict[int, tuple[Tensor, Tensor]] = {}

        def payload(t: Transfer) -> Payload:
            if t.kind == "q":
                if t.block not in held_q:
                    raise self._missing("q", t.block, "a forward send")
                return (held_q[t.block],)
            if t.block not in held_kv:
                raise self._missing("kv", t.block, "a forward send")
            return held_kv[t.block]

        def store(t: Transfer, p: Payload) -> None:
            if t.kind == "q":
                held_q[t.block] = p[0]
            else:
                held_kv[t.block] = (p[0], p[1])

        def compute(kernel: Kernel, stage: int) -> None:
            for r in kernel.q_blocks:
                if r not in held_q:
                    raise self._missing("q", r, f"forward stage {stage}")
            for c in kernel.kv_blocks:
                if c not in held_kv:
                    raise self._missing("kv", c, f"forward stage {stage}")
            qs = _cat([held_q[r] for r in kernel.q_blocks])
            ks = _cat([held_kv[c][0] for c in kernel.kv_blocks])
            vs = _cat([held_kv[c][1] for c in kernel.kv_blocks])
            out, lse = block_forward(qs, ks, vs, sch.tokens(kernel.q_blocks, q.device),
                                     sch.tokens(kernel.kv_blocks, q.device),
                                     mask_mod=self.mask_mod, full=kernel.full,
                                     scale=self.scale)
            start = 0
            for r in kernel.q_blocks:
                n = sch.block_lens[r]
                part = (out[:, :, start:start + n], lse[:, :, start:start + n])
                start += n
                acc[r] = merge_partial(*acc[r], *part) if r in acc else part

        self._run_stages(sch.forward, sch.forward_kernels, payload, store, compute, q)

        def partial(t: Transfer) -> Payload:
            if t.block not in acc:
                raise self._missing("a partial output", t.block, "forward_reduce")
            return acc[t.block]

        received = self._wait(self._post(sch.forward_reduce, partial, q))
        for t, (out_part, lse_part) in received:
            acc[t.block] = (merge_partial(*acc[t.block], out_part, lse_part)
                            if t.block in acc else (out_part, lse_part))
        outs, lses = [], []
        b_, h_, d_ = sch.dims.batch, sch.dims.num_heads, sch.dims.head_dim
        for b in sch.own_blocks:
            if b in acc:
                out_b, lse_b = acc[b]
            else:
                # a row with no allowed element anywhere: out 0, lse -inf (design note §2.7)
                n = sch.block_lens[b]
                out_b = q.new_zeros((b_, h_, n, d_))
                lse_b = q.new_full((b_, h_, n), float("-inf"), dtype=self.row_dtype)
            outs.append(out_b)
            lses.append(lse_b)
        return _cat(outs).contiguous(), _cat(lses).contiguous()

    # --- backward --------------------------------------------------------------------

    def backward(self, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                 lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        sch = self.schedule
        delta = (dout.to(self.row_dtype) * out.to(self.row_dtype)).sum(dim=-1)
        held_qb: dict[int, Payload] = {
            b: (q[:, :, sl], dout[:, :, sl], lse[:, :, sl], delta[:, :, sl])
            for b, sl in sch.local_slices.items()}
        # the global out of own rows, for kernels that take it (only owners have it)
        own_out = {b: out[:, :, sl] for b, sl in sch.local_slices.items()}
        held_kv: dict[int, tuple[Tensor, Tensor]] = {
            b: (k[:, :, sl], v[:, :, sl]) for b, sl in sch.local_slices.items()}
        dq_acc: dict[int, Tensor] = {}
        dk_acc: dict[int, Tensor] = {}
        dv_acc: dict[int, Tensor] = {}

        def payload(t: Transfer) -> Payload:
            if t.kind == "q_bwd":
                if t.block not in held_qb:
                    raise self._missing("q_bwd", t.block, "a backward send")
                return held_qb[t.block]
            if t.block not in held_kv:
                raise self._missing("kv", t.block, "a backward send")
            return held_kv[t.block]

        def store(t: Transfer, p: Payload) -> None:
            if t.kind == "q_bwd":
                held_qb[t.block] = p
            else:
                held_kv[t.block] = (p[0], p[1])

        def compute(kernel: Kernel, stage: int) -> None:
            for r in kernel.q_blocks:
                if r not in held_qb:
                    raise self._missing("q_bwd", r, f"backward stage {stage}")
            for c in kernel.kv_blocks:
                if c not in held_kv:
                    raise self._missing("kv", c, f"backward stage {stage}")
            rows = [held_qb[r] for r in kernel.q_blocks]
            qs, douts, lses, deltas = (_cat([row[i] for row in rows]) for i in range(4))
            ks = _cat([held_kv[c][0] for c in kernel.kv_blocks])
            vs = _cat([held_kv[c][1] for c in kernel.kv_blocks])
            full = kernel.full
            if all(r in own_out for r in kernel.q_blocks):
                outs = _cat([own_out[r] for r in kernel.q_blocks])
            elif not full:
                # the masked path reads delta and never out: any tensor of its shape serves
                outs = douts
            elif q.dtype in (torch.float32, torch.float64):
                outs = _stand_in_out(douts, deltas)
            else:
                # a half-type stand-in cannot hold delta closely enough for the fused
                # kernel's check; the masked path reads delta directly
                outs, full = douts, False
            dq, dk, dv = block_backward(douts, qs, ks, vs, outs, lses, deltas,
                                        sch.tokens(kernel.q_blocks, q.device),
                                        sch.tokens(kernel.kv_blocks, q.device),
                                        mask_mod=self.mask_mod, full=full, scale=self.scale)
            _accumulate(dq_acc, kernel.q_blocks, dq, sch.block_lens)
            _accumulate(dk_acc, kernel.kv_blocks, dk, sch.block_lens)
            _accumulate(dv_acc, kernel.kv_blocks, dv, sch.block_lens)

        self._run_stages(sch.backward, sch.backward_kernels, payload, store, compute, q)

        def partial(t: Transfer) -> Payload:
            if t.kind == "dq":
                if t.block not in dq_acc:
                    raise self._missing("a dq partial", t.block, "backward_reduce")
                return (dq_acc[t.block],)
            if t.block not in dk_acc:
                raise self._missing("a dkv partial", t.block, "backward_reduce")
            return (dk_acc[t.block], dv_acc[t.block])

        for t, p in self._wait(self._post(sch.backward_reduce, partial, q)):
            if t.kind == "dq":
                _accumulate(dq_acc, (t.block,), p[0], sch.block_lens)
            else:
                _accumulate(dk_acc, (t.block,), p[0], sch.block_lens)
                _accumulate(dv_acc, (t.block,), p[1], sch.block_lens)
        return (_gather_own(dq_acc, sch, q), _gather_own(dk_acc, sch, k),
                _gather_own(dv_acc, sch, v))


def _stand_in_out(dout: Tensor, delta: Tensor) -> Tensor:
    """A tensor o shaped like ``dout`` with rowsum(dout * o) = delta.

    The fused CPU backward reads its ``out`` argument only through rowsum(dout * out). A rank
    computing blocks of a row it does not own receives (q, dout, lse, delta), not out (the
    plan's q_bwd payload, design note §2.3), so it hands the kernel this stand-in: each row
    is zero but at the entry of dout of largest magnitude, where it is delta / that entry
    (one rounding; bounded, since |delta| <= |dout|_1 * max|out|). A zero dout row has
    delta 0 and gets a zero row.
    """
    peak = dout.abs().argmax(dim=-1, keepdim=True)
    pivot = dout.gather(-1, peak)
    safe = torch.where(pivot != 0, pivot, torch.ones_like(pivot))
    value = torch.where(pivot != 0, delta.to(dout.dtype).unsqueeze(-1) / safe,
                        torch.zeros_like(pivot))
    return torch.zeros_like(dout).scatter_(-1, peak, value)


def _cat(parts: Sequence[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=2)


def _accumulate(acc: dict[int, Tensor], blocks: Sequence[int], grad: Tensor,
                block_lens: Sequence[int]) -> None:
    start = 0
    for b in blocks:
        n = block_lens[b]
        part = grad[:, :, start:start + n]
        start += n
        # the first partial is copied: it may be a view of a receive buffer or of a kernel's
        # output that a later in-place add must not write through
        acc[b] = acc[b] + part if b in acc else part.clone()


def _gather_own(acc: dict[int, Tensor], sch: _Schedule, like: Tensor) -> Tensor:
    parts = []
    for b in sch.own_blocks:
        if b in acc:
            parts.append(acc[b])
        else:
            # no kernel reads this block: its gradient is exactly zero
            parts.append(like.new_zeros((like.shape[0], like.shape[1], sch.block_lens[b],
                                         like.shape[3])))
    return _cat(parts).contiguous()


class _PlanAttentionFunction(torch.autograd.Function):
    # ctx is torch's FunctionCtx, which carries the attributes set on it untyped
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, runner: _Runner) -> Tensor:
        out, lse = runner.forward(q.detach(), k.detach(), v.detach())
        ctx.runner = runner
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        runner: _Runner = ctx.runner
        dq, dk, dv = runner.backward(dout.contiguous(), q.detach(), k.detach(), v.detach(),
                                     out, lse)
        return dq, dk, dv, None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# schedules per plan (by identity) and rank; a plan is checked once, when first run
_SCHEDULES: weakref.WeakKeyDictionary[Plan, dict[int, _Schedule]] = weakref.WeakKeyDictionary()


def _schedule_for(plan: Plan, rank: int) -> _Schedule:
    """The rank's schedule of ``plan``; the first time, `check_plan` vouches for the plan.

    Every rank checks the same plan, so a broken plan fails on all ranks alike before any
    collective is issued, rather than on one rank while the others wait in an all-to-all.
    """
    per_rank = _SCHEDULES.get(plan)
    if per_rank is None:
        check_plan(plan)
        per_rank = {}
        _SCHEDULES[plan] = per_rank
    schedule = per_rank.get(rank)
    if schedule is None:
        schedule = _Schedule.build(plan, rank)
        per_rank[rank] = schedule
    return schedule


def _check_plan_runnable(plan: Plan, comm: Communicator) -> None:
    if not plan.grid.exact:
        raise PlanError("grid", "an exact BlockGrid (build_block_grid or grid_from_block_mask); "
                        "a sampled grid's block kinds are estimates, and a block it calls "
                        "empty or full may not be")
    if comm.world_size != plan.num_ranks:
        raise PlanError("comm", f"a Communicator over the plan's {plan.num_ranks} ranks; "
                        f"got a group of {comm.world_size}")


def _check_inputs(schedule: _Schedule, q: Tensor, k: Tensor, v: Tensor) -> None:
    dims, shape = schedule.dims, schedule.shape
    L = schedule.local_tokens
    want_q = (dims.batch, dims.num_heads, L, dims.head_dim)
    want_kv = (dims.batch, dims.num_kv_heads, L, dims.head_dim)
    for name, x, want in (("q", q, want_q), ("k", k, want_kv), ("v", v, want_kv)):
        if tuple(x.shape) != want:
            raise PlanError("shape", f"{name} of shape (batch, heads, local tokens, head_dim) "
                            f"= {want} on rank {schedule.rank} for this plan; got "
                            f"{tuple(x.shape)}")
        if _dtype_name(x.dtype) != shape.dtype:
            raise PlanError("dtype", f"{name} in the plan's dtype {shape.dtype} (its byte "
                            f"counts assume it); got {_dtype_name(x.dtype)}")
        if x.device != q.device:
            raise PlanError("device", f"q, k and v on one device; {name} is on {x.device}, "
                            f"q on {q.device}")


@dataclass(frozen=True)
class ContextParallelAttention:
    """The attention function a model calls under context parallelism.

    Models hold no parallelism code: they take an attention callable
    ``attn(q, k, v) -> out`` and this is one, bound to a plan and a communicator. Inputs
    are this rank's tokens in the plan's layout order (`shard`); `positions` are their
    global token ids (the position ids for RoPE).

    Args:
        plan: the plan every rank runs (identical on all ranks).
        comm: a `Communicator` over exactly the plan's ranks.
        scale: softmax scale (default head_dim ** -0.5).
    """

    plan: Plan
    comm: Communicator
    scale: float | None = None
    _schedule: _Schedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_plan_runnable(self.plan, self.comm)
        object.__setattr__(self, "_schedule", _schedule_for(self.plan, self.comm.rank))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def positions(self) -> Tensor:
        """This rank's global token ids, in the order its local tensors hold them."""
        return local_positions(self.plan.layout, self.plan.grid, self.rank)

    def shard(self, x: Tensor, *, dim: int = -2) -> Tensor:
        """This rank's tokens of a global tensor, in layout order."""
        return shard(x, self.plan.layout, self.plan.grid, self.rank, dim=dim)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        _check_inputs(self._schedule, q, k, v)
        scale = self.scale if self.scale is not None else default_scale(q.shape[-1])
        runner = _Runner(self._schedule, self.comm, scale)
        # torch.autograd.Function.apply is untyped
        out = _PlanAttentionFunction.apply(q, k, v, runner)  # type: ignore[no-untyped-call]
        return cast(Tensor, out)


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor, plan: Plan,
                               comm: Communicator, *, rank: int | None = None,
                               scale: float | None = None) -> Tensor:
    """Attention of this rank's tokens under ``plan``; differentiable in q, k and v.

    Args:
        q: (batch, num_heads, local tokens, head_dim), this rank's tokens in the plan's
            layout order (`layout.shard`).
        k, v: (batch, num_kv_heads, local tokens, head_dim), likewise.
        plan: the plan, identical on every rank.
        comm: a `Communicator` over the plan's ranks; every rank must call this (and its
            backward) together, as with any collective.
        rank: this rank in the group (default ``comm.rank``; anything else is an error).
        scale: softmax scale (default head_dim ** -0.5).

    Returns:
        This rank's output rows, (batch, num_heads, local tokens, head_dim).

    Raises:
        PlanError: a sampled grid, a group of another size, a rank other than the group's,
            inputs whose shape or dtype is not the plan's, or a plan whose kernels read
            data their rank does not hold.
    """
    if rank is not None and rank != comm.rank:
        raise PlanError("rank", f"this process's rank in the group ({comm.rank}); got {rank}")
    return ContextParallelAttention(plan, comm, scale=scale)(q, k, v)
