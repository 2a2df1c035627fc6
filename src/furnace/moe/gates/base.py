"""The gate interface every router implements (FastMoE's `BaseGate`, one strategy per file).

A gate maps tokens to ``top_k`` experts out of ``num_experts`` (global experts, across the
whole expert-parallel group) and returns the combine weights and its balance loss. A
dropped assignment (over capacity) has expert id -1 and weight 0; the layer skips it.

Shape suffixes: T = tokens on this rank, D = d_model, N = num_experts (global), K = top_k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn


@dataclass
class GateOutput:
    """What a gate decides for one batch.

    Attributes:
        expert_ids_TK: int64 global expert id per token and choice, -1 where dropped.
        scores_TK: combine weight per token and choice (0 where dropped); gradients flow
            through it into the gate's parameters.
        balance_loss: scalar auxiliary loss of the gate's paper (0 if it has none).
    """

    expert_ids_TK: torch.Tensor
    scores_TK: torch.Tensor
    balance_loss: torch.Tensor


@dataclass(frozen=True)
class GateContext:
    """Where a gate runs: set by `furnace.moe.expert_parallel`, one rank and no comm otherwise.

    Attributes:
        rank, world_size: this rank's place in the expert-parallel group.
        num_experts_per_rank: experts owned by each rank (global expert e lives on rank
            e // num_experts_per_rank).
        ranks_per_node: ranks that share a node (the topology-aware gate's unit).
        comm: the group's `furnace.runtime.Communicator`, for gates that balance globally.
    """

    rank: int = 0
    world_size: int = 1
    num_experts_per_rank: int = 0
    ranks_per_node: int = 1
    comm: object | None = None


def as_gate_output(expert_ids: torch.Tensor, scores: torch.Tensor, num_tokens: int,
                   top_k: int, num_experts: int,
                   balance_loss: torch.Tensor | None = None) -> GateOutput:
    """A FastMoE-style ``(idx, score)`` pair as a `GateOutput`.

    FastMoE's gates return ids and scores of any shape holding ``num_tokens * top_k``
    entries in token-major order ([T, K], [T*K] or [T, 1, K]); dropped assignments have id
    -1. Their scores become 0 here, since the layer skips them (FastMoE's gather leaves
    their rows zero).
    """
    expected = num_tokens * top_k
    if expert_ids.numel() != expected or scores.numel() != expected:
        raise ValueError(f"the gate returned {expert_ids.numel()} ids and {scores.numel()} "
                         f"scores for {num_tokens} tokens with top_k={top_k}; need "
                         f"{expected} of each")
    ids_TK = expert_ids.reshape(num_tokens, top_k).to(torch.int64)
    if ids_TK.numel() and not bool(((ids_TK >= -1) & (ids_TK < num_experts)).all()):
        raise ValueError(f"the gate returned expert ids outside [-1, {num_experts})")
    scores_TK = scores.reshape(num_tokens, top_k)
    scores_TK = torch.where(ids_TK >= 0, scores_TK, torch.zeros_like(scores_TK))
    if balance_loss is None:
        balance_loss = scores_TK.new_zeros(())
    return GateOutput(ids_TK, scores_TK, balance_loss)


class BaseGate(nn.Module):
    """Router base: a linear scorer ``d_model -> num_experts`` and the routing rule.

    Subclasses implement `route(logits_TN)`; `forward(x_TD)` computes the logits with
    ``self.scorer`` and calls it. ``fixed_top_k`` is the one ``top_k`` a gate whose rule
    is defined for a fixed number of choices accepts (None: any), so configs can refuse
    a mismatch before a model is built.
    """

    fixed_top_k: ClassVar[int | None] = None

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2, *, bias: bool = True):
        super().__init__()
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.d_model = d_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.scorer = nn.Linear(d_model, num_experts, bias=bias)
        self.context = GateContext(num_experts_per_rank=num_experts)

    def bind(self, context: GateContext) -> None:
        """Tell the gate where it runs (called when expert parallelism is applied)."""
        self.context = context

    def forward(self, x_TD: torch.Tensor) -> GateOutput:
        return self.route(self.scorer(x_TD))

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        raise NotImplementedError
