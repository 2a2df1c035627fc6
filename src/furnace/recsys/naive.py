"""The single-process reference trainer of pattern-aware sparse communication for DLRM
training (He, Chen, Zhai, PPoPP '24 poster; design note `recsys.md` Sec. 2.6 "expected
equivalence" and Sec. 7 baseline B0).

The poster's full paper is not public; this is the design note's reconstruction of what
distributed training must be equivalent to. It trains on the GLOBAL batch in one process,
in the most obvious way: one full embedding table, autograd through indexing the rows the
batch touched, the mean loss over the batch, then the shared update rules of `optim` on
those rows and on the MLPs. The sharded engine must reproduce its parameters up to summation order.
"""

from __future__ import annotations

import numpy as np
import torch

from .batch import Batch
from .config import DataConfig, ModelConfig, OptimizerConfig
from .model import DLRM, bce_loss, init_embeddings, init_parameters, pool
from .optim import dense_step, new_state, sparse_step

__all__ = ["ReferenceTrainer", "roc_auc"]


class ReferenceTrainer:
    """DLRM on one process. ``.model`` (`init_parameters(seed)`), ``.weights``
    ``[total_rows, D]`` (`init_embeddings(seed)`), ``.state`` (row-wise Adagrad's
    accumulator or None), all in ``dtype``."""

    def __init__(self, data: DataConfig, model: ModelConfig, optim: OptimizerConfig, *,
                 seed: int = 0, dtype: torch.dtype = torch.float64) -> None:
        self.data = data
        self.model_config = model
        self.optim = optim
        self.dtype = dtype
        self.model = DLRM(model, data.num_dense, data.num_tables).to(dtype)
        init_parameters(self.model, seed=seed)
        self.weights = init_embeddings(data.table_rows, model.embedding_dim, seed=seed,
                                       dtype=dtype)
        self.state = new_state(data.total_rows, optim, dtype)
        offsets = [0]
        for rows in data.table_rows[:-1]:
            offsets.append(offsets[-1] + rows)
        self.table_offsets = tuple(offsets)

    def _forward(self, batch: Batch, weights: torch.Tensor,
                 gids: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = batch.to(self.dtype)
        pooled = torch.stack([pool(weights, g, off) for g, off in zip(gids, batch.offsets)],
                             dim=1)
        logits = self.model(batch.dense, pooled)
        return bce_loss(logits, batch.labels), logits

    def step(self, batch: Batch) -> float:
        """One step on the global batch; returns its mean loss (before the update)."""
        gids = batch.global_ids(self.table_offsets)
        # the touched rows (unique global IDs) copied into one leaf: autograd through plain
        # indexing gives their gradients, summed over repeats, and nothing else can change
        touched, inverse = torch.unique(torch.cat(gids), return_inverse=True)
        local = tuple(inverse.split([g.numel() for g in gids]))
        leaf = self.weights[touched].detach().clone().requires_grad_(True)
        loss, _ = self._forward(batch, leaf, local)
        loss.backward()  # type: ignore[no-untyped-call]
        assert leaf.grad is not None
        sparse_step(self.weights, self.state, touched, leaf.grad, self.optim)
        dense_step(self.model.parameters(), self.optim)
        return float(loss.detach())

    def evaluate(self, batch: Batch) -> tuple[float, torch.Tensor]:
        """The mean loss and the logits ``[B]`` of ``batch``, without training."""
        with torch.no_grad():
            loss, logits = self._forward(batch, self.weights,
                                         batch.global_ids(self.table_offsets))
        return float(loss), logits

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """The same keys as the sharded engine's ``full_parameters``: "weights", "state" (if
        the optimizer has one) and the model's state_dict entries."""
        out = {"weights": self.weights.clone()}
        if self.state is not None:
            out["state"] = self.state.clone()
        out.update({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        return out

    def load_parameters(self, params: dict[str, torch.Tensor]) -> None:
        """Take the parameters of a `full_parameters` dict (this trainer's or the engine's),
        e.g. to score a sharded run's result on held-out data."""
        self.weights = params["weights"].detach().to(self.dtype).clone()
        if self.state is not None and "state" in params:
            self.state = params["state"].detach().to(self.dtype).clone()
        dense = {k: v for k, v in params.items() if k not in ("weights", "state")}
        self.model.load_state_dict({k: v.to(self.dtype) for k, v in dense.items()})


def roc_auc(labels: torch.Tensor | np.ndarray, scores: torch.Tensor | np.ndarray) -> float:
    """Area under the ROC curve: the probability that a random positive scores above a
    random negative (ties count half), from the rank statistic. NaN without both classes."""
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    positives, negatives = int(y.sum()), int((~y).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_scores = s[order]
    # average ranks over ties
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(s)]
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0)
                 / (positives * negatives))
