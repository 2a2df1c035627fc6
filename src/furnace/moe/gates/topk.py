"""The plain top-k gate (FastMoE's `NaiveGate`): the k largest logits, softmax over those k.

A production gate, the default of `MoELayer`, not a reference: the module is named for what
it does, since ``naive.py`` names the slow references everywhere else in furnace. The class
keeps FastMoE's name, and the registry name "naive", so FastMoE code finds it.
"""

from __future__ import annotations

import torch

from .base import BaseGate, GateOutput


class NaiveGate(BaseGate):
    """Top-k of a linear scorer; scores are the softmax over the k selected logits only."""

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        top_logits_TK, expert_ids_TK = torch.topk(logits_TN, self.top_k, dim=-1)
        scores_TK = torch.softmax(top_logits_TK, dim=-1)
        return GateOutput(expert_ids_TK, scores_TK, logits_TN.new_zeros(()))
