"""GShard top-2 gate (Lepikhin et al. 2020, "GShard", section 2.2 and algorithm 1; FastMoE's
`GShardGate`).

Scores: softmax over all N logits, the two largest probabilities, renormalised to sum to 1.
Random routing (training only): the second choice is dropped when ``2 * p2 < U(0, 1)``,
p2 being its renormalised score, so a weak second expert is used in proportion to its
weight. Capacity: each expert accepts ``C = ceil(capacity_factor * T * 2 / N)``
assignments; the rest are dropped first-come, every first choice (in token order) ahead of
every second choice, which is GShard's priority. Balance loss: ``mean_e(c_e * m_e) * N^2``.

Capacity is local: T is this rank's token count, so each rank limits what it sends to each
expert and no collective is needed; an expert then receives at most C from every rank. (A
group-wide capacity, FastMoE's DC gate, would need the counts of every rank.)

Shape suffixes: T = tokens, N = global experts, K = top_k = 2.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._routing import (
    drop,
    expert_capacity,
    first_come_keep,
    gshard_balance_loss,
    parse_capacity_factor,
    softmax_wide,
)
from .base import BaseGate, GateOutput


class GShardGate(BaseGate):
    """Top-2 of the full softmax with GShard's capacity, priority and random routing.

    Args:
        d_model, num_experts, bias: as `BaseGate`.
        top_k: must be 2 (GShard is a top-2 gate).
        capacity_factor: a number, or a (train, eval) pair; the default is FastMoE's.
        random_routing: drop second choices at random in training (GShard section 2.2).
    """

    fixed_top_k = 2

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2, *,
                 capacity_factor: float | Sequence[float] = (1.2, 2.4),
                 random_routing: bool = True, bias: bool = True):
        if top_k != self.fixed_top_k:
            raise ValueError(f"GShardGate is a top-{self.fixed_top_k} gate, got top_k={top_k}")
        super().__init__(d_model, num_experts, top_k, bias=bias)
        self.capacity_factor = parse_capacity_factor(capacity_factor)
        self.random_routing = random_routing

    def capacity(self, num_tokens: int) -> int:
        """Assignments each expert accepts from this rank's ``num_tokens`` in the current mode."""
        factor = self.capacity_factor[0 if self.training else 1]
        return expert_capacity(factor, num_tokens * self.top_k, self.num_experts)

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        num_tokens = logits_TN.shape[0]
        probs_TN = softmax_wide(logits_TN)
        top_probs_TK, expert_ids_TK = torch.topk(probs_TN, self.top_k, dim=-1)
        scores_TK = top_probs_TK / top_probs_TK.sum(-1, keepdim=True)
        loss = gshard_balance_loss(logits_TN, expert_ids_TK[:, 0])

        wanted_TK = expert_ids_TK
        if self.training and self.random_routing:
            # p2 <= 1/2 after renormalising, so 2 * p2 is a keep probability in [0, 1]
            uniform_T = torch.rand(num_tokens, dtype=scores_TK.dtype, device=scores_TK.device)
            drop_second_T = 2 * scores_TK[:, 1].detach() < uniform_T
            wanted_TK = expert_ids_TK.clone()
            wanted_TK[:, 1] = torch.where(drop_second_T, -1, expert_ids_TK[:, 1])

        # choice-major order: every first choice claims capacity before any second choice
        wanted_A = wanted_TK.t().reshape(-1)
        keep_A = first_come_keep(wanted_A, self.capacity(num_tokens), self.num_experts)
        keep_TK = keep_A.reshape(self.top_k, num_tokens).t()
        expert_ids_TK, scores_TK = drop(expert_ids_TK, scores_TK.to(logits_TN.dtype), keep_TK)
        return GateOutput(expert_ids_TK, scores_TK, loss)
