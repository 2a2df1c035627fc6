"""Topology-aware top-2 gate: FasterMoE's congestion-avoiding expert selection (He et al.
PPoPP '22; FastMoE's `FasterGate`; design note moe_bagualu.md, A.6).

Experts on this rank's node (``ranks_per_node`` consecutive ranks of
``num_experts_per_rank`` experts each) are local; the others are across the slow
inter-node link. At most ``floor(f * T)`` of this rank's T tokens may use a remote expert:

1. plain top-2 of the logits; if at most floor(f * T) tokens have a remote expert in it,
   keep it;
2. otherwise, of the tokens whose top-1 is remote, the floor(f * T) with the highest top-1
   logit (ties to the earlier token) keep that remote expert as their second choice
   beside their best local expert; every other token gets its top-2 among local experts.

Step 1 counts tokens with *any* remote expert, where FasterMoE counts remote top-1s only,
so that the bound holds for second choices too; with f = 1 the gate is plain top-2.
A node with a single expert cannot give a token two distinct local experts: there the
chosen tokens get (that expert, their remote top-1) and the others keep their plain top-2,
so the bound does not hold. Expert shadowing (which would make shadowed remote experts
local) is not modelled here.

Scores are the softmax over the two selected logits. Balance loss: GShard's
``mean_e(c_e * m_e) * N^2`` on the plain top-1. Deterministic in both modes.

Shape suffixes: T = tokens, N = global experts, K = top_k = 2.
"""

from __future__ import annotations

import math

import torch

from ._routing import gshard_balance_loss, softmax_of_selected
from .base import BaseGate, GateOutput


class TopologyGate(BaseGate):
    """Top-2 gate that caps the tokens this rank sends to other nodes.

    Args:
        d_model, num_experts, bias: as `BaseGate`.
        top_k: must be 2.
        outgoing_fraction: f in [0, 1], the share of tokens allowed to cross nodes
            (FasterMoE's ``FMOE_TOPO_OUTGOING_FRACTION``, default 0.14).

    Needs `bind` with the rank's `GateContext` (``rank``, ``num_experts_per_rank``,
    ``ranks_per_node``); unbound, every expert is local and it is plain top-2.
    """

    fixed_top_k = 2

    def __init__(self, d_model: int, num_experts: int, top_k: int = 2, *,
                 outgoing_fraction: float = 0.14, bias: bool = True):
        if top_k != self.fixed_top_k:
            raise ValueError(f"TopologyGate is a top-{self.fixed_top_k} gate, got top_k={top_k}")
        if not 0 <= outgoing_fraction <= 1:
            raise ValueError(f"outgoing_fraction must be in [0, 1], got {outgoing_fraction}")
        super().__init__(d_model, num_experts, top_k, bias=bias)
        self.outgoing_fraction = outgoing_fraction

    def local_experts(self) -> torch.Tensor:
        """[N] bool: experts on this rank's node, from ``self.context``."""
        ctx = self.context
        if ctx.num_experts_per_rank < 1 or ctx.ranks_per_node < 1 or ctx.rank < 0:
            raise ValueError("TopologyGate needs a context with rank >= 0, "
                             f"num_experts_per_rank >= 1 and ranks_per_node >= 1, got {ctx}")
        experts_per_node = ctx.num_experts_per_rank * ctx.ranks_per_node
        node = ctx.rank // ctx.ranks_per_node
        local_N = torch.arange(self.num_experts) // experts_per_node == node
        if not bool(local_N.any()):
            raise ValueError(f"rank {ctx.rank} is on node {node}, which holds none of the "
                             f"{self.num_experts} experts ({experts_per_node} per node)")
        return local_N

    def outgoing_budget(self, num_tokens: int) -> int:
        """floor(f * T): tokens this rank may send across nodes."""
        # 0.29 * 100 is 28.999999999999996 in binary floating point; nudge it up to 29
        return math.floor(self.outgoing_fraction * num_tokens * (1.0 + 1e-12))

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        local_N = self.local_experts().to(logits_TN.device)
        top_logits_TK, expert_ids_TK = torch.topk(logits_TN, self.top_k, dim=-1)
        loss = gshard_balance_loss(logits_TN, expert_ids_TK[:, 0])

        budget = self.outgoing_budget(logits_TN.shape[0])
        remote_TK = ~local_N[expert_ids_TK]
        if int(remote_TK.any(-1).sum()) > budget:
            expert_ids_TK = self._congestion_avoiding(logits_TN.detach(), local_N,
                                                      top_logits_TK.detach(), expert_ids_TK,
                                                      remote_TK[:, 0], budget)
        return GateOutput(expert_ids_TK, softmax_of_selected(logits_TN, expert_ids_TK), loss)

    def _congestion_avoiding(self, logits_TN, local_N, top_logits_TK, plain_ids_TK,
                             remote_top1_T, budget) -> torch.Tensor:
        candidates = torch.nonzero(remote_top1_T).reshape(-1)
        order = torch.sort(top_logits_TK[candidates, 0], descending=True, stable=True).indices
        chosen = candidates[order[:budget]]
        if int(local_N.sum()) >= 2:
            local_logits_TN = logits_TN.masked_fill(~local_N, float("-inf"))
            expert_ids_TK = torch.topk(local_logits_TN, 2, dim=-1).indices
        else:
            # one local expert: the others keep plain top-2 (see the module docstring)
            expert_ids_TK = plain_ids_TK.clone()
            expert_ids_TK[chosen, 0] = int(torch.nonzero(local_N)[0])
        expert_ids_TK[chosen, 1] = plain_ids_TK[chosen, 0]
        return expert_ids_TK
