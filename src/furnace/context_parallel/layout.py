"""Token placement for UltraAttn's context parallelism (Yang et al., SC'25; design note §2.2,
the ``cmap`` and the context remap).

A `Layout` says which rank owns (stores Q, K, V and O of) each block of the grid: the
paper's ``cmap``. ``contiguous`` is the default placement, ``zigzag`` the head-tail pairing
that balances causal masks (rank r holds chunks r and 2CP-1-r), ``striped`` the round-robin
placement of Striped Attention; `Layout.from_owners` takes any other map (the planner's
hierarchy). Because every layer but attention is token-local, a layout is applied once
before the model (`shard`) and undone after it (`unshard`); `local_positions` gives the
global positions a rank holds, which are the position ids for rotary embeddings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import LayoutError
from .masks import BlockGrid

__all__ = ["LAYOUTS", "Layout", "local_positions", "make_layout", "shard", "unshard"]

LAYOUTS = ("contiguous", "zigzag", "striped")


@dataclass(frozen=True)
class Layout:
    """Owner rank of each block (``owners[i]`` for block ``i``) over ``num_ranks`` ranks."""

    kind: str
    num_blocks: int
    num_ranks: int
    owners: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise LayoutError("ranks", f"must be >= 1, got {self.num_ranks}")
        if len(self.owners) != self.num_blocks:
            raise LayoutError("owners", f"must name one owner per block ({self.num_blocks}), "
                                        f"got {len(self.owners)}")
        bad = [o for o in self.owners if not 0 <= o < self.num_ranks]
        if bad:
            raise LayoutError("owners", f"must be ranks in [0, {self.num_ranks}), got {bad[0]}")

    @classmethod
    def from_owners(cls, owners: Sequence[int], num_ranks: int,
                    kind: str = "custom") -> Layout:
        """A layout from an explicit block -> rank map."""
        return cls(kind=kind, num_blocks=len(owners), num_ranks=num_ranks,
                   owners=tuple(int(o) for o in owners))

    def blocks_of(self, rank: int) -> tuple[int, ...]:
        """The blocks ``rank`` owns, increasing."""
        self._check_rank(rank)
        return tuple(i for i, o in enumerate(self.owners) if o == rank)

    def owner(self, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise LayoutError("block", f"must be in [0, {self.num_blocks}), got {block}")
        return self.owners[block]

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_ranks:
            raise LayoutError("rank", f"must be in [0, {self.num_ranks}), got {rank}")


def _multiples(step: int, at_least: int) -> str:
    first = max(step, (at_least + step - 1) // step * step)
    return f"{first}, {first + step} or {first + 2 * step}"


def make_layout(kind: str, num_blocks: int, num_ranks: int) -> Layout:
    """The ``kind`` layout (one of LAYOUTS) of ``num_blocks`` blocks over ``num_ranks``."""
    if kind not in LAYOUTS:
        raise LayoutError("layout", f"must be one of {', '.join(LAYOUTS)}, got {kind!r}")
    if num_blocks < 1:
        raise LayoutError("num_blocks", f"must be >= 1, got {num_blocks}")
    if not 1 <= num_ranks <= num_blocks:
        raise LayoutError("ranks", f"must be in [1, num_blocks={num_blocks}] (every rank "
                                   f"owns a block), got {num_ranks}")
    step = 2 * num_ranks if kind == "zigzag" else num_ranks
    if num_blocks % step:
        raise LayoutError("num_blocks", f"must be a multiple of {step} for the {kind} layout "
                                        f"on {num_ranks} ranks (e.g. "
                                        f"{_multiples(step, num_blocks)}), got {num_blocks}")
    if kind == "contiguous":
        per_rank = num_blocks // num_ranks
        owners = [i // per_rank for i in range(num_blocks)]
    elif kind == "striped":
        owners = [i % num_ranks for i in range(num_blocks)]
    else:
        chunk = num_blocks // step
        # chunk j goes to rank j in the first half and to rank 2CP-1-j in the second
        owners = [min(i // chunk, step - 1 - i // chunk) for i in range(num_blocks)]
    return Layout(kind=kind, num_blocks=num_blocks, num_ranks=num_ranks, owners=tuple(owners))


def _check(layout: Layout, grid: BlockGrid) -> None:
    if layout.num_blocks != grid.num_blocks:
        raise LayoutError("num_blocks", f"the layout has {layout.num_blocks} blocks and the "
                                        f"grid {grid.num_blocks}; they must match")


def _runs(layout: Layout, grid: BlockGrid, rank: int) -> list[tuple[int, int]]:
    """The rank's tokens as (start, length) runs of adjacent blocks, in block order."""
    runs: list[tuple[int, int]] = []
    for block in layout.blocks_of(rank):
        start, length = grid.block_start(block), grid.block_len(block)
        if runs and runs[-1][0] + runs[-1][1] == start:
            runs[-1] = (runs[-1][0], runs[-1][1] + length)
        else:
            runs.append((start, length))
    return runs


def local_positions(layout: Layout, grid: BlockGrid, rank: int) -> Tensor:
    """Global token ids ``rank`` holds (int64): its blocks in increasing order."""
    _check(layout, grid)
    runs = _runs(layout, grid, rank)
    if not runs:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(s, s + n, dtype=torch.int64) for s, n in runs])


def shard(x: Tensor, layout: Layout, grid: BlockGrid, rank: int, *, dim: int = -2) -> Tensor:
    """The tokens of ``x`` (global order along ``dim``) that ``rank`` holds, in its order."""
    _check(layout, grid)
    if x.size(dim) != grid.seq_len:
        raise LayoutError("seq_len", f"tensor has {x.size(dim)} tokens along dim {dim}, the "
                                     f"grid {grid.seq_len}")
    runs = _runs(layout, grid, rank)
    if not runs:
        return x.narrow(dim, 0, 0)
    return torch.cat([x.narrow(dim, s, n) for s, n in runs], dim=dim)


def unshard(parts: Sequence[Tensor], layout: Layout, grid: BlockGrid, *,
            dim: int = -2) -> Tensor:
    """Every rank's part (rank order) put back in global token order along ``dim``."""
    _check(layout, grid)
    if len(parts) != layout.num_ranks:
        raise LayoutError("parts", f"must hold one tensor per rank ({layout.num_ranks}), got "
                                   f"{len(parts)}")
    positions = [local_positions(layout, grid, rank) for rank in range(layout.num_ranks)]
    for rank, (part, pos) in enumerate(zip(parts, positions)):
        if part.size(dim) != len(pos):
            raise LayoutError("parts", f"rank {rank}'s part must have {len(pos)} tokens along "
                                       f"dim {dim}, got {part.size(dim)}")
    order = torch.cat(positions)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), dtype=torch.int64)
    gathered = torch.cat(list(parts), dim=dim)
    return gathered.index_select(dim, inverse.to(gathered.device))
