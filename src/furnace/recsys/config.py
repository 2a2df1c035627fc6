"""Configs, errors and the sharding plan of pattern-aware sparse communication for DLRM
training (He, Chen, Zhai, PPoPP '24 poster; design note `recsys.md` Sec. 2, 7).

Every error a user can cause is a `ConfigFieldError` subclass (from `furnace.runtime.cliargs`):
it names the field and says what is allowed, so the CLI turns it into one line naming its own
flag. The dataclasses here are the inputs of the generator, the model, the optimizers, the
planner and the engine; `ShardingPlan` is the planner's output and the engine's input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from furnace.runtime.cliargs import ConfigFieldError, require_positive_ints

__all__ = [
    "CRITEO_KAGGLE_ROWS",
    "DataConfig",
    "DataError",
    "EngineConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PlanError",
    "SCHEMES",
    "SPARSE_OPTIMIZERS",
    "ShardingPlan",
    "scaled_table_rows",
]

# Criteo Kaggle (Display Advertising Challenge) cardinalities of its 26 categorical features,
# as the DLRM and TorchRec scripts list them (design note Sec. 6).
CRITEO_KAGGLE_ROWS: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)

# The schemes the engine runs side by side (design note Sec. 7, "Baselines"):
#   table_pooled  B1: whole tables per rank, every rank reads the global batch's IDs of its
#                 tables (no ID exchange) and returns pooled vectors (the DLRM reference);
#   row           B2: rows spread over ranks, every ID occurrence sent to its owner;
#   row_dedup     B3: as B2, each distinct row sent once per (source, owner) pair;
#   hybrid        P:  B3 with the hot rows replicated on every rank (the plan's hot set).
SCHEMES: tuple[str, ...] = ("table_pooled", "row", "row_dedup", "hybrid")
SPARSE_OPTIMIZERS: tuple[str, ...] = ("sgd", "rowwise_adagrad")


class DataError(ConfigFieldError):
    """Input data that cannot be used: an ID outside its table, a malformed TSV line."""


class PlanError(ConfigFieldError):
    """A planner or engine input that cannot be planned (a budget below zero, ...)."""


def scaled_table_rows(scale: float, *, base: tuple[int, ...] = CRITEO_KAGGLE_ROWS,
                      min_rows: int = 2) -> tuple[int, ...]:
    """Criteo's cardinalities times ``scale``, each at least ``min_rows`` (so that a table of
    3 rows stays a table of 3 rows while a table of 10 M rows fits in RAM)."""
    if not (isinstance(scale, (int, float)) and 0 < scale <= 1):
        raise DataError("row_scale", f"must be in (0, 1], got {scale!r}")
    return tuple(max(min(n, min_rows), math.ceil(n * scale)) for n in base)


@dataclass(frozen=True)
class DataConfig:
    """A synthetic Criteo-like click log (design note Sec. 6, "Recommended generator").

    Attributes:
        table_rows: rows of each categorical table.
        num_dense: dense (continuous) features per sample.
        zipf_exponent: s of the per-table Zipf law over row ranks (0 is uniform).
        bag_size: IDs per bag: 1 is one-hot (Criteo); n > 1 draws each bag's length
            uniformly from 1..2n-1 (mean n), as multi-hot data.
        seed: seeds the permutation from rank to row ID, the planted model and the batches.
    """

    table_rows: tuple[int, ...] = field(default_factory=lambda: scaled_table_rows(1e-3))
    num_dense: int = 13
    zipf_exponent: float = 1.05
    bag_size: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.table_rows:
            raise DataError("table_rows", "must name at least one table")
        for t, rows in enumerate(self.table_rows):
            if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
                raise DataError("table_rows", f"table {t} must have >= 1 rows, got {rows!r}")
        require_positive_ints(self, ("num_dense", "bag_size"), DataError)
        if not (isinstance(self.zipf_exponent, (int, float)) and 0 <= self.zipf_exponent <= 4
                and math.isfinite(self.zipf_exponent)):
            raise DataError("zipf_exponent", f"must be in [0, 4], got {self.zipf_exponent!r}")

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def total_rows(self) -> int:
        return sum(self.table_rows)


@dataclass(frozen=True)
class ModelConfig:
    """DLRM's shape (Naumov et al. 2019), laid out as TorchRec's ``DLRM`` is.

    Attributes:
        embedding_dim: D, the width of every embedding row.
        bottom_mlp: widths of the bottom MLP's layers (ReLU after each); the last must be D.
        top_mlp: widths of the top MLP's layers (ReLU after each but the last); the last
            must be 1, the click logit.
        interaction: "dot" (pairwise dot products of the bottom output and the pooled
            embeddings, DLRM) or "dcn" (DCN-v2 cross layers over their concatenation).
        cross_layers: DCN-v2 layers when ``interaction == "dcn"``.
    """

    embedding_dim: int = 16
    bottom_mlp: tuple[int, ...] = (64, 16)
    top_mlp: tuple[int, ...] = (64, 1)
    interaction: str = "dot"
    cross_layers: int = 2

    def __post_init__(self) -> None:
        require_positive_ints(self, ("embedding_dim", "cross_layers"), PlanError)
        for name in ("bottom_mlp", "top_mlp"):
            widths = getattr(self, name)
            if not widths or any(not isinstance(w, int) or w < 1 for w in widths):
                raise PlanError(name, f"must be widths >= 1, got {widths!r}")
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise PlanError("bottom_mlp", f"must end in embedding_dim={self.embedding_dim}, "
                            f"got {self.bottom_mlp!r}")
        if self.top_mlp[-1] != 1:
            raise PlanError("top_mlp", f"must end in 1 (the logit), got {self.top_mlp!r}")
        if self.interaction not in ("dot", "dcn"):
            raise PlanError("interaction", f"must be 'dot' or 'dcn', got {self.interaction!r}")


@dataclass(frozen=True)
class OptimizerConfig:
    """Dense SGD and a lazy sparse optimizer: only the rows a batch touches are updated.

    Attributes:
        sparse: "sgd" or "rowwise_adagrad" (one accumulator per row: the mean of the
            squared gradient over the row, as `facebookresearch/dlrm` `optim/rwsadagrad.py`).
        lr: the embedding rows' learning rate.
        dense_lr: the MLPs' learning rate (plain SGD).
        weight_decay: added to a touched row's gradient (``g + wd * w``); untouched rows do
            not decay, so replicas must agree on which rows the global batch touched.
        eps: Adagrad's denominator floor.
        initial_accumulator: Adagrad's starting accumulator value.
    """

    sparse: str = "sgd"
    lr: float = 0.1
    dense_lr: float = 0.1
    weight_decay: float = 0.0
    eps: float = 1e-8
    initial_accumulator: float = 0.0

    def __post_init__(self) -> None:
        if self.sparse not in SPARSE_OPTIMIZERS:
            raise PlanError("sparse", f"must be one of {', '.join(SPARSE_OPTIMIZERS)}, "
                            f"got {self.sparse!r}")
        for name in ("lr", "dense_lr", "eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise PlanError(name, f"must be a finite number > 0, got {value!r}")
        for name in ("weight_decay", "initial_accumulator"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise PlanError(name, f"must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    """How the distributed engine runs one scheme (design note Sec. 2.3, 2.5).

    Attributes:
        scheme: one of `SCHEMES`.
        prefetch: post the next batch's ID exchange (and its split counts) before this step's
            backward, so it runs behind it;
            IDs do not depend on weights (Sec. 2.5.1).
        overlap: post the vector exchange asynchronously and run the hot lookups and the
            bottom MLP while it flies; post the cold-gradient exchange before the dense
            all-reduce and wait on both together (Sec. 2.5.2).
        pairwise: split each vector and gradient exchange into W-1 pairwise rounds (rank r
            sends to r+s and receives from r-s), pooling each round's vectors as they
            arrive (FasterMoE's smart schedule, Sec. 2.5.3).
        fuse_allreduce: all-reduce the hot-row gradients and touched counts in the same
            buffer as the dense gradients, one op instead of two (Sec. 2.5.4).
    """

    scheme: str = "hybrid"
    prefetch: bool = False
    overlap: bool = False
    pairwise: bool = False
    fuse_allreduce: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise PlanError("scheme", f"must be one of {', '.join(SCHEMES)}, "
                            f"got {self.scheme!r}")

    @property
    def dedup(self) -> bool:
        return self.scheme in ("row_dedup", "hybrid")

    @classmethod
    def scheduled(cls, scheme: str = "hybrid") -> EngineConfig:
        """The scheme with every scheduling technique on."""
        return cls(scheme=scheme, prefetch=True, overlap=True, pairwise=True,
                   fuse_allreduce=True)


@dataclass(frozen=True)
class ShardingPlan:
    """Where every embedding row lives (design note Sec. 2.3, fold 1).

    Rows are named by a global ID: row ``r`` of table ``t`` is ``table_offsets[t] + r``.

    Attributes:
        world_size: W, the ranks.
        table_rows: rows of each table.
        sharding: "table" (each table whole on `table_owner[t]`) or "row" (global row g on
            rank ``g % W``, at slot ``g // W`` of that rank's shard).
        table_owner: owner rank of each table ("table" sharding; empty for "row").
        hot_rows: sorted global IDs replicated on every rank (weights and optimizer state);
            hot slot ``i`` holds global row ``hot_rows[i]``. Empty means no replication.
    """

    world_size: int
    table_rows: tuple[int, ...]
    sharding: str = "row"
    table_owner: tuple[int, ...] = ()
    hot_rows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require_positive_ints(self, ("world_size",), PlanError)
        if self.sharding not in ("table", "row"):
            raise PlanError("sharding", f"must be 'table' or 'row', got {self.sharding!r}")
        if self.sharding == "table":
            if len(self.table_owner) != len(self.table_rows):
                raise PlanError("table_owner", f"needs one owner per table "
                                f"({len(self.table_rows)}), got {len(self.table_owner)}")
            bad = [o for o in self.table_owner if not 0 <= o < self.world_size]
            if bad:
                raise PlanError("table_owner", f"owners must be in 0..{self.world_size - 1}, "
                                f"got {bad[0]}")
        elif self.table_owner:
            raise PlanError("table_owner", "is only for table sharding")
        total = sum(self.table_rows)
        hot = self.hot_rows
        if any(b <= a for a, b in zip(hot, hot[1:])):
            raise PlanError("hot_rows", "must be strictly increasing global row IDs")
        if hot and not (0 <= hot[0] and hot[-1] < total):
            raise PlanError("hot_rows", f"must be global row IDs in 0..{total - 1}")

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def total_rows(self) -> int:
        return sum(self.table_rows)

    @property
    def table_offsets(self) -> tuple[int, ...]:
        offsets = [0]
        for rows in self.table_rows[:-1]:
            offsets.append(offsets[-1] + rows)
        return tuple(offsets)

    def owner_of(self, global_ids: torch.Tensor) -> torch.Tensor:
        """The owner rank of each global row ID (int64 tensor in, int64 tensor out)."""
        if self.sharding == "row":
            return global_ids % self.world_size
        starts = torch.tensor(self.table_offsets[1:], dtype=torch.int64)
        tables = torch.bucketize(global_ids, starts, right=True)
        return torch.tensor(self.table_owner, dtype=torch.int64)[tables]

    def slot_of(self, global_ids: torch.Tensor) -> torch.Tensor:
        """Each row's index in its owner's shard (see `shard_rows`)."""
        if self.sharding == "row":
            return global_ids // self.world_size
        starts = torch.tensor(self.table_offsets, dtype=torch.int64)
        tables = torch.bucketize(global_ids, starts[1:], right=True)
        # an owner's shard is its tables, in table order, one after the other
        base = torch.zeros(self.num_tables, dtype=torch.int64)
        filled = [0] * self.world_size
        for t, (o, rows) in enumerate(zip(self.table_owner, self.table_rows)):
            base[t] = filled[o]
            filled[o] += rows
        return global_ids - starts[tables] + base[tables]

    def shard_rows(self, rank: int) -> torch.Tensor:
        """Global IDs of the rows rank ``rank`` owns, in slot order (hot rows included: the
        owner keeps their storage, unused while they are hot)."""
        if self.sharding == "row":
            return torch.arange(rank, self.total_rows, self.world_size, dtype=torch.int64)
        parts = [torch.arange(off, off + rows, dtype=torch.int64)
                 for off, rows, o in zip(self.table_offsets, self.table_rows, self.table_owner)
                 if o == rank]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def hot_slot(self) -> torch.Tensor:
        """An int64 map from global row ID to hot slot, -1 for a cold row."""
        slots = torch.full((self.total_rows,), -1, dtype=torch.int64)
        if self.hot_rows:
            slots[torch.tensor(self.hot_rows, dtype=torch.int64)] = torch.arange(
                len(self.hot_rows), dtype=torch.int64)
        return slots
