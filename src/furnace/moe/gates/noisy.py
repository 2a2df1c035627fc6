"""Noisy top-k gate (Shazeer et al. 2017, "Outrageously Large Neural Networks", section 2.1,
section 4 and appendix A; FastMoE's `NoisyGate`).

``H(x) = x W_g + randn * softplus(x W_noise)`` in training, ``x W_g`` in eval; the k largest
entries of H are kept and the scores are the softmax over those k. The balance loss is

    w_importance * cv^2(Importance) + w_load * cv^2(Load)

with ``Importance_e = sum_t G(x_t)_e``, G the sparse gate (the top-k softmax, 0 outside the
top k, as the paper defines it), and ``Load_e`` the paper's smooth estimator
``sum_t P(x_t, e)``: the probability that e stays in the top k when only its own noise is
redrawn (appendix A, through the normal CDF). In eval, or without noise, Load is the hard
count of tokens per expert.

Shape suffixes: T = tokens, D = d_model, N = global experts, K = top_k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._routing import cv_squared, softmax_wide
from .base import BaseGate, GateOutput


def prob_in_top_k(clean_TN: torch.Tensor, noisy_TN: torch.Tensor, noise_std_TN: torch.Tensor,
                  k: int) -> torch.Tensor:
    """Shazeer's P(x, e) per token and expert (appendix A), in float32 or wider.

    For an expert inside the noisy top k, the bar it must stay above when its noise is
    redrawn is the (k+1)-th largest noisy logit; for one outside, the k-th largest. Needs
    ``k < N`` (with k == N every expert is always in).
    """
    wide = torch.promote_types(clean_TN.dtype, torch.float32)
    clean_TN, noisy_TN, noise_std_TN = (t.to(wide) for t in (clean_TN, noisy_TN, noise_std_TN))
    top_TK1 = torch.topk(noisy_TN, k + 1, dim=-1).values
    bar_if_in_T1 = top_TK1[:, k:k + 1]
    bar_if_out_T1 = top_TK1[:, k - 1:k]
    is_in_TN = noisy_TN > bar_if_in_T1
    prob_if_in_TN = torch.special.ndtr((clean_TN - bar_if_in_T1) / noise_std_TN)
    prob_if_out_TN = torch.special.ndtr((clean_TN - bar_if_out_T1) / noise_std_TN)
    return torch.where(is_in_TN, prob_if_in_TN, prob_if_out_TN)


class NoisyGate(BaseGate):
    """Shazeer's noisy top-k gating with a learned per-expert noise scale.

    Args:
        d_model, num_experts, top_k, bias: as `BaseGate` (bias also applies to ``noise``).
        w_importance: weight of cv^2(Importance) in the balance loss (the paper's w_importance).
        w_load: weight of cv^2(Load) (the paper's w_load).
        noise_epsilon: added to softplus(x W_noise) so the noise scale, which divides in
            the load estimator, never underflows to 0.

    ``noise`` (d_model -> N) starts at zero, as the paper initialises W_noise, so the
    initial noise std is softplus(0) + noise_epsilon for every expert.
    """

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2, *,
                 w_importance: float = 1e-2, w_load: float = 1e-2, noise_epsilon: float = 1e-2,
                 bias: bool = True):
        super().__init__(d_model, num_experts, top_k, bias=bias)
        if w_importance < 0 or w_load < 0:
            raise ValueError(f"loss weights must be >= 0, got w_importance={w_importance}, "
                             f"w_load={w_load}")
        if noise_epsilon < 0:
            raise ValueError(f"noise_epsilon must be >= 0, got {noise_epsilon}")
        self.w_importance = w_importance
        self.w_load = w_load
        self.noise_epsilon = noise_epsilon
        self.noise = nn.Linear(d_model, num_experts, bias=bias)
        nn.init.zeros_(self.noise.weight)
        if self.noise.bias is not None:
            nn.init.zeros_(self.noise.bias)

    def forward(self, x_TD: torch.Tensor) -> GateOutput:
        logits_TN = self.scorer(x_TD)
        noise_std_TN = None
        if self.training:
            noise_std_TN = F.softplus(self.noise(x_TD)) + self.noise_epsilon
        return self.route(logits_TN, noise_std_TN)

    def route(self, logits_TN: torch.Tensor,
              noise_std_TN: torch.Tensor | None = None) -> GateOutput:
        """Route clean logits; with ``noise_std_TN`` and in training, add the paper's noise."""
        noise_TN = noise_std_TN if self.training else None
        if noise_TN is not None:
            # the only use of the RNG, and only in training, so eval is deterministic
            noisy_TN = logits_TN + torch.randn_like(logits_TN) * noise_TN
        else:
            noisy_TN = logits_TN
        top_logits_TK, expert_ids_TK = torch.topk(noisy_TN, self.top_k, dim=-1)
        wide_scores_TK = softmax_wide(top_logits_TK)

        num_tokens = logits_TN.shape[0]
        gates_TN = wide_scores_TK.new_zeros((num_tokens, self.num_experts))
        gates_TN = gates_TN.scatter(1, expert_ids_TK, wide_scores_TK)
        importance_N = gates_TN.sum(0)
        if noise_TN is not None and self.top_k < self.num_experts:
            load_N = prob_in_top_k(logits_TN, noisy_TN, noise_TN, self.top_k).sum(0)
        else:
            load_N = torch.bincount(expert_ids_TK.reshape(-1), minlength=self.num_experts)
            load_N = load_N.to(importance_N.dtype)
        loss = self.w_importance * cv_squared(importance_N) + self.w_load * cv_squared(load_N)
        return GateOutput(expert_ids_TK, wide_scores_TK.to(logits_TN.dtype),
                          loss.to(logits_TN.dtype))
