"""One batch of click-log samples: dense features, bags of categorical IDs, labels.

The sparse part is laid out as TorchRec's ``KeyedJaggedTensor`` is, one jagged list per
table: bag ``b`` of table ``t`` is ``ids[t][offsets[t][b]:offsets[t][b + 1]]``, so one-hot
data has ``offsets[t] == arange(B + 1)`` and multi-hot data any lengths (an empty bag pools
to zeros). IDs are row indices within their table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Batch"]


@dataclass(frozen=True)
class Batch:
    """Samples ``0..B-1``: ``dense`` [B, F] float, ``ids``/``offsets`` per table, ``labels``
    [B] float in {0, 1}."""

    dense: torch.Tensor
    ids: tuple[torch.Tensor, ...]
    offsets: tuple[torch.Tensor, ...]
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.offsets):
            raise ValueError(f"{len(self.ids)} id lists but {len(self.offsets)} offset lists")
        b = self.batch_size
        for t, (ids, off) in enumerate(zip(self.ids, self.offsets)):
            if off.shape != (b + 1,) or int(off[0]) != 0 or int(off[-1]) != ids.numel():
                raise ValueError(f"table {t}: offsets must be [B + 1] from 0 to len(ids)")

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_tables(self) -> int:
        return len(self.ids)

    def lengths(self, table: int) -> torch.Tensor:
        return self.offsets[table].diff()

    def slice(self, start: int, stop: int) -> Batch:
        """Samples ``start..stop-1`` as a batch of their own (a rank's local batch)."""
        ids, offsets = [], []
        for tid, off in zip(self.ids, self.offsets):
            lo, hi = int(off[start]), int(off[stop])
            ids.append(tid[lo:hi])
            offsets.append(off[start:stop + 1] - lo)
        return Batch(self.dense[start:stop], tuple(ids), tuple(offsets),
                     self.labels[start:stop])

    def local(self, rank: int, world_size: int) -> Batch:
        """Rank ``rank``'s equal share of the global batch (samples in rank order)."""
        b = self.batch_size
        if b % world_size:
            raise ValueError(f"global batch {b} does not split over {world_size} ranks")
        per = b // world_size
        return self.slice(rank * per, (rank + 1) * per)

    def global_ids(self, table_offsets: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """Each table's IDs shifted to global row IDs (row r of table t is offset_t + r)."""
        return tuple(ids + off for ids, off in zip(self.ids, table_offsets))

    def to(self, dtype: torch.dtype) -> Batch:
        """The same batch with float tensors (dense, labels) in ``dtype``."""
        return Batch(self.dense.to(dtype), self.ids, self.offsets, self.labels.to(dtype))
