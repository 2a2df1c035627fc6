"""Tests of the token layouts of UltraAttn's context parallelism
(`furnace.context_parallel.layout`; design note §2.2, the cmap): the owners of every kind
against their definitions, the errors that name what would work, and shard / unshard /
local_positions on a ragged sequence."""

from __future__ import annotations

import pytest
import torch

from furnace.context_parallel.config import LayoutError
from furnace.context_parallel.layout import (
    LAYOUTS,
    Layout,
    local_positions,
    make_layout,
    shard,
    unshard,
)
from furnace.context_parallel.masks import build_block_grid, causal_mask

# planning is integer and combinatorial work: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


def test_owners_of_each_kind() -> None:
    assert make_layout("contiguous", 8, 4).owners == (0, 0, 1, 1, 2, 2, 3, 3)
    assert make_layout("striped", 8, 4).owners == (0, 1, 2, 3, 0, 1, 2, 3)
    assert make_layout("zigzag", 8, 2).owners == (0, 0, 1, 1, 1, 1, 0, 0)
    assert make_layout("zigzag", 8, 4).owners == (0, 1, 2, 3, 3, 2, 1, 0)
    for ranks in (1, 2, 4):
        for num_blocks in (8, 16):
            per_rank = num_blocks // ranks
            contiguous = make_layout("contiguous", num_blocks, ranks)
            striped = make_layout("striped", num_blocks, ranks)
            zigzag = make_layout("zigzag", num_blocks, ranks)
            chunk = num_blocks // (2 * ranks)
            for rank in range(ranks):
                assert contiguous.blocks_of(rank) == tuple(
                    range(rank * per_rank, (rank + 1) * per_rank))
                assert striped.blocks_of(rank) == tuple(range(rank, num_blocks, ranks))
                # chunks r and 2CP-1-r: a head chunk and its mirrored tail chunk
                tail = 2 * ranks - 1 - rank
                assert zigzag.blocks_of(rank) == (
                    *range(rank * chunk, (rank + 1) * chunk),
                    *range(tail * chunk, (tail + 1) * chunk))
            for layout in (contiguous, striped, zigzag):
                assert layout.num_blocks == num_blocks and layout.num_ranks == ranks
                assert all(layout.owner(b) == layout.owners[b] for b in range(num_blocks))
    assert set(LAYOUTS) == {"contiguous", "zigzag", "striped"}


def test_layout_errors_name_what_works() -> None:
    with pytest.raises(LayoutError) as info:
        make_layout("contiguous", 4, 8)
    assert info.value.field == "ranks"
    with pytest.raises(LayoutError) as info:
        make_layout("striped", 4, 0)
    assert info.value.field == "ranks"
    with pytest.raises(LayoutError) as info:
        make_layout("contiguous", 10, 4)
    assert info.value.field == "num_blocks" and "multiple of 4" in info.value.allowed
    assert "12" in info.value.allowed  # the next size that would work
    with pytest.raises(LayoutError) as info:
        make_layout("zigzag", 12, 4)  # divisible by CP but not by 2 CP
    assert info.value.field == "num_blocks" and "multiple of 8" in info.value.allowed
    with pytest.raises(LayoutError) as info:
        make_layout("zigzag", 4, 4)  # as many ranks as blocks, but zigzag needs 2 per rank
    assert info.value.field == "num_blocks"
    with pytest.raises(LayoutError) as info:
        make_layout("diagonal", 8, 2)
    assert info.value.field == "layout" and "zigzag" in info.value.allowed
    with pytest.raises(LayoutError) as info:
        Layout.from_owners([0, 2, 1], 2)
    assert info.value.field == "owners"
    layout = make_layout("contiguous", 4, 2)
    with pytest.raises(LayoutError):
        layout.blocks_of(2)
    with pytest.raises(LayoutError):
        layout.owner(4)


def test_from_owners() -> None:
    layout = Layout.from_owners([1, 0, 1, 1, 0], 3)
    assert layout.kind == "custom" and layout.num_blocks == 5 and layout.num_ranks == 3
    assert layout.blocks_of(1) == (0, 2, 3) and layout.blocks_of(0) == (1, 4)
    assert layout.blocks_of(2) == ()  # a custom map may leave a rank without blocks


def test_shard_unshard_round_trip_with_ragged_last_block() -> None:
    seq_len, block_size = 37, 5  # 8 blocks, the last one of 2 tokens
    grid = build_block_grid(causal_mask(), seq_len, block_size)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, seq_len, 4, dtype=torch.float64, generator=gen)
    layouts = [make_layout(kind, 8, ranks) for kind in LAYOUTS for ranks in (1, 2, 4)]
    layouts.append(Layout.from_owners([2, 0, 0, 1, 2, 1, 0, 2], 3))
    layouts.append(Layout.from_owners([0, 0, 0, 0, 0, 0, 0, 0], 2))
    for layout in layouts:
        label = f"{layout.kind} on {layout.num_ranks}"
        positions = [local_positions(layout, grid, r) for r in range(layout.num_ranks)]
        # positions: the rank's blocks in increasing order, their tokens concatenated
        for rank, pos in enumerate(positions):
            expected = [t for b in layout.blocks_of(rank) for t in range(
                b * block_size, min((b + 1) * block_size, seq_len))]
            assert pos.dtype == torch.int64 and pos.tolist() == expected, label
        assert sorted(torch.cat(positions).tolist()) == list(range(seq_len)), label
        parts = [shard(x, layout, grid, r) for r in range(layout.num_ranks)]
        for part, pos in zip(parts, positions):
            assert torch.equal(part, x[:, :, pos]), label
        assert torch.equal(unshard(parts, layout, grid), x), label
        # another dim, and autograd through both directions
        tokens_first = x.permute(2, 0, 1, 3).clone().requires_grad_(True)
        pieces = [shard(tokens_first, layout, grid, r, dim=0) for r in range(layout.num_ranks)]
        back = unshard(pieces, layout, grid, dim=0)
        assert torch.equal(back, tokens_first), label
        weight = torch.randn(back.shape, dtype=torch.float64, generator=gen)
        (back * weight).sum().backward()
        assert tokens_first.grad is not None and torch.equal(tokens_first.grad, weight), label


def test_shard_and_unshard_reject_mismatches() -> None:
    grid = build_block_grid(causal_mask(), 37, 5)
    layout = make_layout("zigzag", 8, 2)
    x = torch.zeros(1, 1, 37, 2)
    with pytest.raises(LayoutError) as info:
        shard(torch.zeros(1, 1, 36, 2), layout, grid, 0)
    assert info.value.field == "seq_len"
    with pytest.raises(LayoutError) as info:
        local_positions(make_layout("zigzag", 16, 2), grid, 0)
    assert info.value.field == "num_blocks"
    parts = [shard(x, layout, grid, r) for r in range(2)]
    with pytest.raises(LayoutError) as info:
        unshard(parts[:1], layout, grid)
    assert info.value.field == "parts"
    with pytest.raises(LayoutError) as info:
        unshard([parts[1], parts[0]], layout, grid)  # rank 0 holds 17 tokens, rank 1 20
    assert info.value.field == "parts"
    with pytest.raises(LayoutError):
        shard(x, layout, grid, 2)
