"""The dense part of DLRM (Naumov et al. 2019) as laid out by TorchRec's ``DLRM``, and the
sum pooling of embedding bags, for pattern-aware sparse communication (He, Chen, Zhai,
PPoPP '24 poster; design note `recsys.md` Sec. 7, component 2 "model").

The poster's full paper is not public: the model below is the standard DLRM the design note
reconstructs the system around, not something the poster specifies.

The model holds no embeddings and no parallelism code: embedding rows live in a plain
``[total_rows, D]`` tensor (or a rank's shard of it) owned by whoever trains, and `pool`
turns a bag of global row IDs into the ``[B, D]`` sums the model consumes. Every trainer
(the single-process reference and the sharded engine) therefore runs the same `DLRM` on
the same pooled tensor, and every rank can build the same initial parameters from the seed
alone (`init_parameters`, `init_embeddings`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .batch import Batch
from .config import ModelConfig

__all__ = ["DLRM", "bce_loss", "dense_flops", "dense_parameter_count", "init_embeddings",
           "init_parameters", "pool", "pool_batch"]


def _mlp(in_features: int, widths: Sequence[int], *, relu_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(in_features, width))
        if relu_last or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = width
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP on the dense features, an interaction with the pooled embeddings, top MLP.

    ``forward(dense [B, F], pooled [B, T, D]) -> logits [B]``.

    Interactions:
        "dot": stack ``[dense_out, emb_0, ..., emb_{T-1}]`` to ``[B, T+1, D]``, take all
            pairwise dot products ``i < j`` in ``torch.triu_indices(T+1, T+1, 1)`` order and
            feed ``cat(dense_out, dots)`` to the top MLP (TorchRec ``InteractionArch``).
        "dcn": ``x0 = cat(dense_out, emb_0, ..., emb_{T-1})`` of width ``(T+1) D``, then
            DCN-v2 cross layers ``x_{l+1} = x0 * (W_l x_l + b_l) + x_l`` (full-rank ``W_l``,
            Wang et al. 2021) before the top MLP.
    """

    pair_rows: torch.Tensor
    pair_cols: torch.Tensor

    def __init__(self, config: ModelConfig, num_dense: int, num_tables: int) -> None:
        super().__init__()
        if num_dense < 1 or num_tables < 1:
            raise ValueError(f"need num_dense >= 1 and num_tables >= 1, "
                             f"got {num_dense}, {num_tables}")
        self.config = config
        self.num_dense = num_dense
        self.num_tables = num_tables
        d = config.embedding_dim
        features = num_tables + 1
        # TorchRec's DenseArch puts a ReLU after every bottom layer, the last one included
        self.bottom = _mlp(num_dense, config.bottom_mlp, relu_last=True)
        self.cross = nn.ModuleList()
        if config.interaction == "dot":
            top_in = d + features * (features - 1) // 2
            rows, cols = torch.triu_indices(features, features, 1)
            self.register_buffer("pair_rows", rows, persistent=False)
            self.register_buffer("pair_cols", cols, persistent=False)
        else:
            top_in = features * d
            self.cross.extend(nn.Linear(top_in, top_in) for _ in range(config.cross_layers))
        self.top = _mlp(top_in, config.top_mlp, relu_last=False)

    def interact(self, dense_out: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``dense_out [B, D]``, ``pooled [B, T, D]`` -> the top MLP's input."""
        if self.config.interaction == "dot":
            stacked = torch.cat([dense_out.unsqueeze(1), pooled], dim=1)   # [B, T+1, D]
            gram = torch.bmm(stacked, stacked.transpose(1, 2))            # [B, T+1, T+1]
            dots = gram[:, self.pair_rows, self.pair_cols]
            return torch.cat([dense_out, dots], dim=1)
        x0 = torch.cat([dense_out, pooled.flatten(1)], dim=1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        return x

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        b, t, d = pooled.shape
        if t != self.num_tables or d != self.config.embedding_dim or dense.shape != (
                b, self.num_dense):
            raise ValueError(f"expected dense [B, {self.num_dense}] and pooled "
                             f"[B, {self.num_tables}, {self.config.embedding_dim}], got "
                             f"{tuple(dense.shape)} and {tuple(pooled.shape)}")
        logits: torch.Tensor = self.top(self.interact(self.bottom(dense), pooled))
        return logits.squeeze(1)


def init_parameters(model: DLRM, *, seed: int) -> None:
    """Deterministic init, a pure function of ``seed`` and the model's shape.

    As the DLRM reference (``dlrm_s_pytorch.py`` ``create_mlp``): weights
    ``N(0, sqrt(2 / (fan_in + fan_out)))``, biases ``N(0, sqrt(1 / fan_out))``. Values are
    drawn in float64 by numpy and cast, so float32 and float64 models start at the same
    point up to rounding.
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x4D4F44454C,)))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                fan_out, fan_in = module.weight.shape
                w = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), size=(fan_out, fan_in))
                module.weight.copy_(torch.from_numpy(w))
                if module.bias is not None:
                    bias = rng.normal(0.0, math.sqrt(1.0 / fan_out), size=fan_out)
                    module.bias.copy_(torch.from_numpy(bias))


def init_embeddings(table_rows: Sequence[int], embedding_dim: int, *, seed: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Every table's rows, concatenated in table order: ``[total_rows, D]``.

    Table ``t`` is ``uniform(-1/sqrt(n_t), 1/sqrt(n_t))`` (the DLRM reference's
    ``create_emb``), drawn from a stream of its own seeded by ``(seed, t)``, in float64 and
    then cast: a pure function of ``(seed, table_rows, D)``, so every rank builds the same
    full table and slices its shard, and float32 and float64 runs agree up to rounding.
    """
    total = sum(table_rows)
    weights = torch.empty(total, embedding_dim, dtype=dtype)
    start = 0
    for t, rows in enumerate(table_rows):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x454D42, t)))
        bound = 1.0 / math.sqrt(rows)
        values = rng.uniform(-bound, bound, size=(rows, embedding_dim))
        weights[start:start + rows] = torch.from_numpy(values)
        start += rows
    return weights


def pool(weights: torch.Tensor, gids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Sum pooling: bag ``b`` is ``weights[gids[offsets[b]:offsets[b+1]]].sum(0)``; an empty
    bag pools to zeros. ``weights [R, D]``, ``gids [N]``, ``offsets [B+1]`` -> ``[B, D]``.
    Differentiable in ``weights``."""
    lengths = offsets.diff()
    bags = torch.repeat_interleave(torch.arange(lengths.numel(), device=gids.device), lengths)
    out = weights.new_zeros(lengths.numel(), weights.shape[1])
    return out.index_add(0, bags, weights[gids])


def pool_batch(weights: torch.Tensor, batch: Batch,
               table_offsets: Sequence[int]) -> torch.Tensor:
    """Every table's pooled bags of ``batch`` from the full table ``weights``: ``[B, T, D]``."""
    gids = batch.global_ids(tuple(table_offsets))
    return torch.stack([pool(weights, g, off) for g, off in zip(gids, batch.offsets)], dim=1)


def dense_flops(config: ModelConfig, num_dense: int, num_tables: int,
                batch_size: int) -> float:
    """Forward FLOPs of the dense part for ``batch_size`` samples (a multiply-add is 2).

    Counts the MLP and cross-layer matmuls, the Gram matrix of the dot interaction
    (``(T+1)^2 D`` multiply-adds per sample, as ``bmm`` computes it whole) and the cross
    layers' elementwise product and sum; ReLUs, pooling and the loss are left out.
    """
    d = config.embedding_dim
    features = num_tables + 1
    per_sample = 0.0
    fan_in = num_dense
    for width in config.bottom_mlp:
        per_sample += 2.0 * fan_in * width
        fan_in = width
    if config.interaction == "dot":
        per_sample += 2.0 * features * features * d
        fan_in = d + features * (features - 1) // 2
    else:
        width = features * d
        per_sample += config.cross_layers * (2.0 * width * width + 2.0 * width)
        fan_in = width
    for width in config.top_mlp:
        per_sample += 2.0 * fan_in * width
        fan_in = width
    return per_sample * batch_size


def dense_parameter_count(config: ModelConfig, num_dense: int, num_tables: int) -> int:
    """Parameters of the dense part: what the dense all-reduce carries per step."""
    return sum(p.numel() for p in DLRM(config, num_dense, num_tables).parameters())


def bce_loss(logits: torch.Tensor, labels: torch.Tensor, *,
             total: int | None = None) -> torch.Tensor:
    """Sum of binary cross-entropy with logits over the samples, divided by ``total``
    (default: the number of samples). A rank passes the global batch size so that its local
    loss is its share of the global mean, and the ranks' gradients add up to the global
    one."""
    denominator = logits.numel() if total is None else total
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype),
                                              reduction="sum") / denominator
