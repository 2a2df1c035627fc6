"""The update rules of pattern-aware sparse communication for DLRM training (He, Chen, Zhai,
PPoPP '24 poster; design note `recsys.md` Sec. 2.6 "Backward and optimizer; exactness"):
lazy sparse SGD and row-wise Adagrad for embedding rows, plain SGD for the MLPs.

The poster's full paper is not public; the optimizers are the design note's reconstruction.
This is the ONE implementation of the rules: the single-process reference (`naive`) and
every rank of the sharded engine call `sparse_step` on the rows they own or replicate, so an
engine that hands it the same rows and summed gradients gets the same numbers.

Lazy means only the rows a batch touched change: weight decay is added to a touched row's
gradient and untouched rows do not decay, so replicas of a hot row must agree on which rows
the global batch touched (the engine all-reduces touched counts for that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .config import OptimizerConfig

__all__ = ["SparseOptimizerState", "dense_step", "new_state", "sparse_step"]


def new_state(num_rows: int, config: OptimizerConfig,
              dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """The sparse optimizer's per-row state: row-wise Adagrad's accumulator (one value per
    row, filled with ``initial_accumulator``), or None for SGD, which keeps none."""
    if config.sparse == "sgd":
        return None
    return torch.full((num_rows,), float(config.initial_accumulator), dtype=dtype)


def sparse_step(weights: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor,
                grads: torch.Tensor, config: OptimizerConfig) -> None:
    """Update ``weights[rows]`` (and ``state[rows]``) in place; no other row changes.

    ``rows`` are UNIQUE indices into ``weights`` (a duplicate would be updated from one of
    its gradients only: sum duplicates' gradients first), ``grads [len(rows), D]``.
    With ``g = grads + weight_decay * w[rows]``:
        sgd:             ``w[rows] -= lr * g``;
        rowwise_adagrad: ``state[rows] += mean(g**2, dim=1)``,
                         ``w[rows] -= lr * g / (sqrt(state[rows]) + eps)``
    (`facebookresearch/dlrm` ``optim/rwsadagrad.py``, whose state is one scalar per row).
    """
    if grads.shape != (rows.numel(), weights.shape[1]):
        raise ValueError(f"grads must be [{rows.numel()}, {weights.shape[1]}], "
                         f"got {tuple(grads.shape)}")
    if rows.numel() == 0:
        return
    with torch.no_grad():
        current = weights[rows]
        g = grads.to(weights.dtype)
        if config.weight_decay:
            g = g + config.weight_decay * current
        if config.sparse == "sgd":
            weights[rows] = current - config.lr * g
            return
        if state is None:
            raise ValueError("rowwise_adagrad needs a state (see new_state)")
        accumulated = state[rows] + g.pow(2).mean(dim=1).to(state.dtype)
        state[rows] = accumulated
        denominator = accumulated.sqrt().to(weights.dtype) + config.eps
        weights[rows] = current - config.lr * g / denominator.unsqueeze(1)


def dense_step(params: Iterable[torch.Tensor], config: OptimizerConfig) -> None:
    """Plain SGD on the MLPs: ``p -= dense_lr * p.grad`` (no momentum, no weight decay),
    then drop the gradients. A parameter without a gradient is left alone."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.sub_(config.dense_lr * p.grad)
                p.grad = None


@dataclass
class SparseOptimizerState:
    """A table's (or shard's) sparse optimizer state: ``accumulator`` is row-wise Adagrad's
    per-row 1-D accumulator, or None for SGD."""

    config: OptimizerConfig
    accumulator: torch.Tensor | None

    @classmethod
    def create(cls, num_rows: int, config: OptimizerConfig,
               dtype: torch.dtype = torch.float32) -> SparseOptimizerState:
        return cls(config, new_state(num_rows, config, dtype))

    def step(self, weights: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """`sparse_step` with this state."""
        sparse_step(weights, self.accumulator, rows, grads, self.config)
