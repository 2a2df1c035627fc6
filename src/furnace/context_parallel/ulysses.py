"""DeepSpeed-Ulysses over the same sequence-sharded inputs: the head-parallel baseline that
UltraAttn is compared with (Yang et al., SC'25, §6; design note §6.1 item 6).

Ulysses swaps the sharded dimension instead of moving blocks: one all-to-all per tensor
turns q, k and v from "this rank's tokens, all heads" into "all tokens, this rank's
``H / CP`` heads", every rank then runs the whole block-sparse attention for its heads,
and one all-to-all brings the output back to sequence sharding. The backward is the same
four all-to-alls reversed (dout in; dq, dk, dv back), so a call costs 4 + 4
``all_to_all_single`` per forward and backward, and its bytes do not depend on the mask
(`baselines.ulysses_stats` counts them). It needs CP to divide both the query and the
key/value heads.

The inputs are in any `Layout`'s order: the tokens received from each rank are put back in
global order with the layout's positions before attention, and the output is returned in
the same layout order, so Ulysses drops in wherever `execute.context_parallel_attention`
runs. The attention itself is the block kernels over every non-empty block of the grid,
merged by the log-sum-exp (design note §2.7), with its own exact backward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from furnace.runtime.comm import Communicator, all_to_all_single_autograd

from .config import PlanError
from .execute import default_scale
from .kernels import block_backward, block_forward, empty_partial, merge_partial
from .layout import Layout, local_positions
from .masks import FULL, BlockGrid, MaskMod

__all__ = ["UlyssesAttention", "ulysses_attention"]


def _offset_heads(mask_mod: MaskMod, offset: int) -> MaskMod:
    """``mask_mod`` seen by a rank that holds heads offset, offset+1, ...: the kernels number
    heads from 0, so a head-dependent mask must see the global head index."""
    if offset == 0:
        return mask_mod

    def mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return mask_mod(b, h + offset, q_idx, kv_idx)

    return mask


class _BlockSparseAttention(torch.autograd.Function):
    """Attention over the whole sequence restricted to the grid's non-empty blocks, one
    kernel per block, with the exact backward from the merged rows' lse and delta."""

    # ctx is torch's FunctionCtx, which carries the attributes set on it untyped
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, grid: BlockGrid,
                mask_mod: MaskMod, scale: float) -> Tensor:
        blocks = _grid_blocks(grid, q.device)
        outs, lses = [], []
        for r, cols in blocks.rows:
            rq = slice(grid.block_start(r), grid.block_start(r) + grid.block_len(r))
            acc = empty_partial(q[:, :, rq])
            for c, full in cols:
                kc = slice(grid.block_start(c), grid.block_start(c) + grid.block_len(c))
                part = block_forward(q[:, :, rq], k[:, :, kc], v[:, :, kc], blocks.tokens[r],
                                     blocks.tokens[c], mask_mod=mask_mod, full=full,
                                     scale=scale)
                acc = merge_partial(*acc, *part)
            outs.append(acc[0])
            lses.append(acc[1])
        out = torch.cat(outs, dim=2)
        lse = torch.cat(lses, dim=2)
        ctx.grid, ctx.mask_mod, ctx.scale = grid, mask_mod, scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        grid: BlockGrid = ctx.grid
        dout = dout.contiguous()
        delta = (dout.to(lse.dtype) * out.to(lse.dtype)).sum(dim=-1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        blocks = _grid_blocks(grid, q.device)
        for r, cols in blocks.rows:
            rq = slice(grid.block_start(r), grid.block_start(r) + grid.block_len(r))
            for c, full in cols:
                kc = slice(grid.block_start(c), grid.block_start(c) + grid.block_len(c))
                dq_b, dk_b, dv_b = block_backward(
                    dout[:, :, rq], q[:, :, rq], k[:, :, kc], v[:, :, kc], out[:, :, rq],
                    lse[:, :, rq], delta[:, :, rq], blocks.tokens[r], blocks.tokens[c],
                    mask_mod=ctx.mask_mod, full=full, scale=ctx.scale)
                dq[:, :, rq] += dq_b
                dk[:, :, kc] += dk_b
                dv[:, :, kc] += dv_b
        return dq, dk, dv, None, None, None


@dataclass(frozen=True)
class _GridBlocks:
    # per non-empty row: (row, ((column, full), ...))
    rows: tuple[tuple[int, tuple[tuple[int, bool], ...]], ...]
    tokens: tuple[Tensor, ...]


def _grid_blocks(grid: BlockGrid, device: torch.device) -> _GridBlocks:
    rows: dict[int, list[tuple[int, bool]]] = {r: [] for r in range(grid.num_blocks)}
    for r, c in grid.nonempty():
        rows[r].append((c, bool(grid.kinds[r, c] == FULL)))
    tokens = tuple(grid.block_tokens(i).to(device) for i in range(grid.num_blocks))
    return _GridBlocks(tuple((r, tuple(cols)) for r, cols in rows.items()), tokens)


def _split_rows(flat: Tensor, sizes: Sequence[int]) -> list[Tensor]:
    return list(torch.split(flat, list(sizes)))


@dataclass(frozen=True)
class UlyssesAttention:
    """Ulysses as the attention callable a model takes: ``attn(q, k, v) -> out`` on this
    rank's tokens in ``layout`` order (see `ulysses_attention`)."""

    comm: Communicator
    grid: BlockGrid
    layout: Layout
    scale: float | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return ulysses_attention(q, k, v, self.comm, grid=self.grid, layout=self.layout,
                                 scale=self.scale)


def _check(q: Tensor, k: Tensor, v: Tensor, comm: Communicator, grid: BlockGrid,
           layout: Layout, local_tokens: int) -> None:
    cp = comm.world_size
    if not grid.exact:
        raise PlanError("grid", "an exact BlockGrid (build_block_grid or grid_from_block_mask); "
                        "a sampled grid's block kinds are estimates")
    if layout.num_ranks != cp or layout.num_blocks != grid.num_blocks:
        raise PlanError("layout", f"a layout of the grid's {grid.num_blocks} blocks over the "
                        f"group's {cp} ranks; got {layout.num_blocks} blocks over "
                        f"{layout.num_ranks} ranks")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise PlanError("shape", "q (batch, heads, tokens, head_dim) and k, v of one shape "
                        f"(batch, kv_heads, tokens, head_dim); got {tuple(q.shape)}, "
                        f"{tuple(k.shape)}, {tuple(v.shape)}")
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % cp or num_kv_heads % cp:
        raise PlanError("num_ranks", f"a divisor of num_heads ({num_heads}) and num_kv_heads "
                        f"({num_kv_heads}): Ulysses shards heads; got {cp} ranks")
    if num_heads % num_kv_heads:
        raise PlanError("num_kv_heads", f"a divisor of num_heads ({num_heads}); got "
                        f"{num_kv_heads}")
    if q.shape[2] != local_tokens or k.shape[2] != local_tokens or \
            q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise PlanError("shape", f"this rank's {local_tokens} tokens in the layout's order, "
                        f"q and k of one batch and head_dim; got q {tuple(q.shape)}, "
                        f"k {tuple(k.shape)}")


def ulysses_attention(q: Tensor, k: Tensor, v: Tensor, comm: Communicator, *, grid: BlockGrid,
                      layout: Layout, scale: float | None = None) -> Tensor:
    """Block-sparse attention of this rank's tokens by DeepSpeed-Ulysses; differentiable.

    Args:
        q: (batch, num_heads, local tokens, head_dim), this rank's tokens in ``layout``
            order (`layout.shard`); k, v: (batch, num_kv_heads, local tokens, head_dim).
        comm: a `Communicator` over the layout's ranks; every rank calls this together.
        grid: the mask's exact block grid (the blocks attention runs).
        layout: where the tokens are.
        scale: softmax scale (default head_dim ** -0.5).

    Returns:
        This rank's output rows (batch, num_heads, local tokens, head_dim), layout order.

    Raises:
        PlanError: CP does not divide the heads, a sampled grid, or inputs that are not
            this rank's share.
    """
    cp, rank = comm.world_size, comm.rank
    positions = [local_positions(layout, grid, i) for i in range(layout.num_ranks)]
    _check(q, k, v, comm, grid, layout, len(positions[rank]) if rank < len(positions) else -1)
    batch, num_heads, local, head_dim = q.shape
    lens = [len(p) for p in positions]
    order = torch.cat(positions).to(q.device)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=q.device)

    def to_head_sharded(x: Tensor) -> Tensor:
        heads = x.shape[1] // cp
        send = torch.cat([x[:, j * heads:(j + 1) * heads].reshape(-1) for j in range(cp)])
        recv_sizes = [batch * heads * n * head_dim for n in lens]
        recv = all_to_all_single_autograd(send, comm, recv_sizes,
                                          [batch * heads * local * head_dim] * cp)
        parts = [p.view(batch, heads, n, head_dim)
                 for p, n in zip(_split_rows(recv, recv_sizes), lens)]
        return torch.cat(parts, dim=2).index_select(2, inverse)

    q_all, k_all, v_all = to_head_sharded(q), to_head_sharded(k), to_head_sharded(v)
    heads = num_heads // cp
    s = scale if scale is not None else default_scale(head_dim)
    mask_mod = _offset_heads(grid.mask_mod, rank * heads)
    # torch.autograd.Function.apply is untyped
    out_all = cast(Tensor, _BlockSparseAttention.apply(  # type: ignore[no-untyped-call]
        q_all, k_all, v_all, grid, mask_mod, s))
    # back to layout order, cut by destination rank
    in_layout = out_all.index_select(2, order)
    send_sizes = [batch * heads * n * head_dim for n in lens]
    send = torch.cat([p.reshape(-1) for p in torch.split(in_layout, lens, dim=2)])
    recv_size = batch * heads * local * head_dim
    recv = all_to_all_single_autograd(send, comm, [recv_size] * cp, send_sizes)
    parts = [p.view(batch, heads, local, head_dim) for p in _split_rows(recv, [recv_size] * cp)]
    return torch.cat(parts, dim=1)
