"""Zero gate (FastMoE's `ZeroGate`): a fixed routing for tests, not a learned router.

Every token goes to expert 0 with score 1 when ``top_k == 1``; for ``top_k > 1`` to experts
``0 .. top_k - 1`` with equal scores ``1 / top_k``. The scorer exists (the `BaseGate`
contract) but is unused, so no gradient reaches it and the balance loss is 0.
"""

from __future__ import annotations

import torch

from .base import BaseGate, GateOutput


class ZeroGate(BaseGate):
    """Constant routing to the first ``top_k`` experts; deterministic in both modes."""

    def __init__(self, d_model: int, num_experts: int, top_k: int = 1, *, bias: bool = True):
        super().__init__(d_model, num_experts, top_k, bias=bias)

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        num_tokens = logits_TN.shape[0]
        expert_ids_TK = torch.arange(self.top_k, device=logits_TN.device).expand(
            num_tokens, self.top_k).contiguous()
        scores_TK = logits_TN.new_full((num_tokens, self.top_k), 1.0 / self.top_k)
        return GateOutput(expert_ids_TK, scores_TK, logits_TN.new_zeros(()))
