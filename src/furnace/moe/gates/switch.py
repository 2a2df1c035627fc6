"""Switch gate (Fedus et al. 2021, "Switch Transformers", sections 2.1, 2.2 and 2.4; FastMoE's
`SwitchGate`).

Top-1 routing: the softmax over all N logits in float32 or wider, the largest probability
is the expert and its probability the score (not renormalised, so the router gets a
gradient). Capacity ``C = ceil(capacity_factor * T / N)`` per expert, later tokens
dropped first. Balance loss ``N * sum_e f_e * P_e``: f_e the fraction of tokens whose
top-1 is e (before drops), P_e the mean probability of e.

Exploration noise: in training the router *input* is multiplied by U(1 - eps, 1 + eps),
the multiplicative jitter of the Switch Transformer code (Mesh TensorFlow's
``input_jitter`` policy), rather than FastMoE's noise added to the logits. The jitter lives
in `forward`, so `route` on given logits is deterministic in both modes.

Shape suffixes: T = tokens, D = d_model, N = global experts, K = top_k = 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._routing import drop, expert_capacity, first_come_keep, parse_capacity_factor, softmax_wide
from .base import BaseGate, GateOutput


class SwitchGate(BaseGate):
    """Top-1 gate with capacity, input jitter and the Switch load-balancing loss.

    Args:
        d_model, num_experts, bias: as `BaseGate`.
        top_k: must be 1 (a Switch layer routes each token to one expert).
        capacity_factor: a number, or a (train, eval) pair; the default is FastMoE's.
        jitter_eps: half-width of the multiplicative input noise, in [0, 1); 0 disables it.
    """

    fixed_top_k = 1

    def __init__(self, d_model: int, num_experts: int, top_k: int = 1, *,
                 capacity_factor: float | Sequence[float] = (1.0, 2.0), jitter_eps: float = 0.1,
                 bias: bool = True):
        if top_k != self.fixed_top_k:
            raise ValueError(f"SwitchGate is a top-{self.fixed_top_k} gate, got top_k={top_k}")
        if not 0 <= jitter_eps < 1:
            raise ValueError(f"jitter_eps must be in [0, 1), got {jitter_eps}")
        super().__init__(d_model, num_experts, top_k, bias=bias)
        self.capacity_factor = parse_capacity_factor(capacity_factor)
        self.jitter_eps = jitter_eps

    def capacity(self, num_tokens: int) -> int:
        """Tokens each expert accepts from this rank's ``num_tokens`` in the current mode."""
        factor = self.capacity_factor[0 if self.training else 1]
        return expert_capacity(factor, num_tokens, self.num_experts)

    def forward(self, x_TD: torch.Tensor) -> GateOutput:
        if self.training and self.jitter_eps > 0:
            jitter_TD = torch.empty_like(x_TD).uniform_(1 - self.jitter_eps, 1 + self.jitter_eps)
            x_TD = x_TD * jitter_TD
        return self.route(self.scorer(x_TD))

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        num_tokens = logits_TN.shape[0]
        probs_TN = softmax_wide(logits_TN)
        top_prob_T, expert_id_T = torch.max(probs_TN, dim=-1)
        if num_tokens > 0:
            f_N = torch.bincount(expert_id_T, minlength=self.num_experts).to(probs_TN.dtype)
            f_N = f_N / num_tokens
            loss = (self.num_experts * torch.sum(f_N * probs_TN.mean(0))).to(logits_TN.dtype)
        else:
            loss = logits_TN.new_zeros(())
        keep_T = first_come_keep(expert_id_T, self.capacity(num_tokens), self.num_experts)
        expert_ids_TK, scores_TK = drop(expert_id_T[:, None], top_prob_T[:, None].to(
            logits_TN.dtype), keep_T[:, None])
        return GateOutput(expert_ids_TK, scores_TK, loss)
