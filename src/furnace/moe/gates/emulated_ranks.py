"""A gate that routes one process's batch as if it came from several expert-parallel ranks.

Rank-aware gates (the topology-aware gate of FasterMoE, He et al. PPoPP '22) decide from
the rank a token is on. To study them without launching those ranks, `EmulatedRanksGate`
wraps a gate, splits the batch into ``world_size`` consecutive slices (as `torch.chunk`
does: ceil(T / world_size) tokens each, the last ranks may get fewer or none), routes slice
r with the wrapped gate bound to rank r's `GateContext`, and concatenates the decisions in
token order. The balance loss is the mean over the slices, as if each rank's loss were
averaged. It also counts the assignments that land on another node than their token's rank
(``cross_node`` of ``assignments``), the traffic the topology-aware gate exists to cut.

Shape suffixes: T = tokens, D = d_model, K = top_k.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import BaseGate, GateContext, GateOutput


class EmulatedRanksGate(BaseGate):
    """``gate`` applied per emulated rank: rank r routes the r-th slice of every batch.

    Args:
        gate: the wrapped gate, ``inner`` (its scorer is the only one: this gate has no
            ``scorer`` of its own; the wrapped gate's context is restored after every
            forward).
        world_size: emulated ranks W; ``gate.num_experts`` must be
            ``world_size * num_experts_per_rank``.
        num_experts_per_rank, ranks_per_node: the emulated placement (`GateContext`).

    Attributes:
        cross_node, assignments: running totals over every forward since construction (or
            `reset_counts`): assignments to an expert on another node than the token's
            rank, and all kept (not dropped) assignments.
    """

    def __init__(self, gate: BaseGate, *, world_size: int, num_experts_per_rank: int,
                 ranks_per_node: int = 1):
        # no BaseGate.__init__: the wrapped gate's scorer is the only one
        nn.Module.__init__(self)
        if world_size < 1 or num_experts_per_rank < 1 or ranks_per_node < 1:
            raise ValueError("world_size, num_experts_per_rank and ranks_per_node must be "
                             f">= 1, got {world_size}, {num_experts_per_rank}, "
                             f"{ranks_per_node}")
        if gate.num_experts != world_size * num_experts_per_rank:
            raise ValueError(f"the gate routes to {gate.num_experts} experts, but "
                             f"{world_size} ranks x {num_experts_per_rank} experts hold "
                             f"{world_size * num_experts_per_rank}")
        self.inner = gate
        self.d_model = gate.d_model
        self.num_experts = gate.num_experts
        self.top_k = gate.top_k
        self.contexts = [GateContext(rank=r, world_size=world_size,
                                     num_experts_per_rank=num_experts_per_rank,
                                     ranks_per_node=ranks_per_node)
                         for r in range(world_size)]
        self.context = GateContext(num_experts_per_rank=self.num_experts)
        self.cross_node = 0
        self.assignments = 0

    def bind(self, context: GateContext) -> None:
        raise TypeError("an EmulatedRanksGate emulates its ranks itself; bind the wrapped "
                        "gate instead when expert parallelism is real")

    def reset_counts(self) -> None:
        self.cross_node = 0
        self.assignments = 0

    def forward(self, x_TD: torch.Tensor) -> GateOutput:
        saved = self.inner.context
        outs = []
        try:
            for context, part_TD in zip(self.contexts, torch.chunk(x_TD, len(self.contexts))):
                self.inner.bind(context)
                out = self.inner(part_TD)
                self._count(out.expert_ids_TK, context)
                outs.append(out)
        finally:
            self.inner.bind(saved)
        return GateOutput(torch.cat([o.expert_ids_TK for o in outs]),
                          torch.cat([o.scores_TK for o in outs]),
                          sum(o.balance_loss for o in outs) / len(outs))

    def _count(self, expert_ids_TK: torch.Tensor, context: GateContext) -> None:
        kept_TK = expert_ids_TK >= 0
        experts_per_node = context.num_experts_per_rank * context.ranks_per_node
        node_TK = expert_ids_TK // experts_per_node
        self.cross_node += int((kept_TK & (node_TK != context.rank // context.ranks_per_node))
                               .sum())
        self.assignments += int(kept_TK.sum())
