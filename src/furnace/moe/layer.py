"""The MoE layer (FastMoE's `FMoE` / `FMoETransformerMLP`, FasterMoE section 2).

`MoELayer` = a replicated gate + a bank of experts. In one process it holds every expert
and dispatches locally. `furnace.moe.expert_parallel` applies expert parallelism to it
(shards the experts over a process group and routes tokens with all-to-all), so the model
that contains the layer holds no parallelism code. A layer may also be built with only
one rank's slice of the experts (a bank with ``first_expert`` set), so no rank ever holds
the whole bank; it then runs only once expert parallelism is applied.

Shape suffixes: T = tokens, D = d_model, K = top_k, A = assignments (T*K, dropped ones
removed), N = global experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .experts import ExpertBank, MLPExperts
from .gates import BaseGate, GateOutput, make_gate

if TYPE_CHECKING:
    from .parallel import ExpertParallel


@dataclass
class RoutingStats:
    """What the gate did on this rank in the last forward (for traces and load metrics).

    Attributes:
        tokens: tokens routed by this rank.
        tokens_per_expert: assignments per global expert from this rank (after drops).
        dropped: assignments the gate dropped (capacity).
    """

    tokens: int
    tokens_per_expert: list[int]
    dropped: int


class MoELayer(nn.Module):
    """Mixture of experts: ``y_t = sum_k score_tk * expert_{e_tk}(x_t)``.

    Args:
        d_model: token width H.
        num_experts: global number of experts N (over the whole expert-parallel group).
        top_k: experts per token.
        d_hidden: expert hidden width (default 4 * d_model) when ``experts`` is None.
        gate: a gate name (see `furnace.moe.gates.GATES`) or a `BaseGate`; a subclass whose
            `route` adapts another gate interface may pass any gate module.
        gate_kwargs: extra arguments for a gate built by name.
        experts: an `ExpertBank` (`MLPExperts`, `ModuleExperts`, ...) with all
            ``num_experts`` experts, or with one rank's slice of them (``num_experts`` a
            multiple of its size, ``first_expert`` on a slice boundary); an `MLPExperts`
            bank of every expert is built if None.
        activation: expert activation when the bank is built here.

    After each forward, ``balance_loss`` holds the gate's auxiliary loss and
    ``last_routing`` the `RoutingStats`.
    """

    def __init__(self, *, d_model: int, num_experts: int, top_k: int = 2,
                 d_hidden: int | None = None, gate: str | nn.Module = "naive",
                 gate_kwargs: dict | None = None, experts: ExpertBank | None = None,
                 activation: str = "gelu") -> None:
        super().__init__()
        if isinstance(gate, str):
            gate = make_gate(gate, d_model, num_experts, top_k, **(gate_kwargs or {}))
        elif gate_kwargs:
            raise ValueError("gate_kwargs only apply to a gate given by name")
        gate_experts = getattr(gate, "num_experts", num_experts)
        gate_top_k = getattr(gate, "top_k", top_k)
        if gate_experts != num_experts or gate_top_k != top_k:
            raise ValueError(f"gate routes to {gate_experts} experts with top-{gate_top_k}, "
                             f"layer has {num_experts} with top-{top_k}")
        if experts is None:
            experts = MLPExperts(num_experts, d_model, d_hidden or 4 * d_model,
                                 activation=activation)
        if not isinstance(experts, ExpertBank):
            raise ValueError(f"experts must be a furnace.moe ExpertBank, got "
                             f"{type(experts).__name__}")
        E, first = experts.num_experts, experts.first_expert
        is_slice = E >= 1 and num_experts % E == 0 and first % E == 0 and first + E <= num_experts
        if not is_slice or experts.d_model != d_model:
            raise ValueError(f"the expert bank (experts {first}..{first + E - 1}, d_model "
                             f"{experts.d_model}) does not match num_experts={num_experts} / "
                             f"d_model={d_model}")
        self.d_model = d_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.gate = gate
        self.experts = experts
        # set by expert_parallel(); None means every expert is here
        self.parallel: ExpertParallel | None = None
        self.balance_loss: torch.Tensor = torch.zeros(())
        self.last_routing: RoutingStats | None = None

    @property
    def num_experts_per_rank(self) -> int:
        return self.experts.num_experts

    @property
    def holds_all_experts(self) -> bool:
        return self.experts.num_experts == self.num_experts

    def route(self, x_TD: torch.Tensor) -> GateOutput:
        """The gate's decision for tokens ``x_TD`` (subclasses adapt other gate interfaces)."""
        return self.gate(x_TD)

    def local_forward(self, x_TD: torch.Tensor, routing: GateOutput) -> torch.Tensor:
        """Every expert in this process (the path without expert parallelism)."""
        return local_moe(x_TD, routing, self.experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"expected last dim {self.d_model}, got shape {tuple(x.shape)}")
        if self.parallel is None and not self.holds_all_experts:
            first = self.experts.first_expert
            last = first + self.num_experts_per_rank - 1
            raise RuntimeError(f"this layer holds experts {first}..{last} of {self.num_experts} "
                               "only; apply furnace.moe.expert_parallel before running it")
        x_TD = x.reshape(-1, self.d_model)
        routing = self.route(x_TD)
        self.balance_loss = routing.balance_loss
        self.last_routing = routing_stats(routing, self.num_experts)
        if self.parallel is None:
            y_TD = self.local_forward(x_TD, routing)
        else:
            y_TD = self.parallel.forward(self, x_TD, routing)
        return y_TD.reshape(x.shape)


def routing_stats(routing: GateOutput, num_experts: int) -> RoutingStats:
    ids = routing.expert_ids_TK.reshape(-1)
    kept = ids[ids >= 0]
    counts = torch.bincount(kept, minlength=num_experts)
    return RoutingStats(tokens=routing.expert_ids_TK.shape[0], tokens_per_expert=counts.tolist(),
                        dropped=int((ids < 0).sum()))


def sort_assignments(routing: GateOutput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kept assignments sorted by expert (stable, so ties keep token order).

    Returns:
        token_A: source token of each assignment, in expert order.
        expert_A: its global expert id.
        slot_A: its flat index into the [T, K] routing arrays.
    """
    ids = routing.expert_ids_TK.reshape(-1)
    slot = torch.nonzero(ids >= 0).reshape(-1)
    order = torch.argsort(ids[slot], stable=True)
    slot_A = slot[order]
    return slot_A // routing.expert_ids_TK.shape[1], ids[slot_A], slot_A


def combine(y_AD: torch.Tensor, token_A: torch.Tensor, slot_A: torch.Tensor,
            routing: GateOutput, num_tokens: int) -> torch.Tensor:
    """``out_t = sum over its assignments a of score_a * y_a`` (differentiable in both)."""
    scores_A = routing.scores_TK.reshape(-1)[slot_A].to(y_AD.dtype)
    out_TD = y_AD.new_zeros((num_tokens, y_AD.shape[1]))
    return out_TD.index_add(0, token_A, y_AD * scores_A[:, None])


def local_moe(x_TD: torch.Tensor, routing: GateOutput, experts: ExpertBank) -> torch.Tensor:
    """Every expert in this process: sort by expert, run each block, weight and sum."""
    token_A, expert_A, slot_A = sort_assignments(routing)
    counts = torch.bincount(expert_A - experts.first_expert, minlength=experts.num_experts)
    y_AD = experts(x_TD[token_A], counts.tolist())
    return combine(y_AD, token_A, slot_A, routing, x_TD.shape[0])


class MoETransformerMLP(MoELayer):
    """FastMoE's `FMoETransformerMLP`: a MoE layer of 2-layer MLP experts H -> F -> H."""

    def __init__(self, *, d_model: int, d_hidden: int, num_experts: int, top_k: int = 2,
                 gate: str | BaseGate = "naive", gate_kwargs: dict | None = None,
                 activation: str = "gelu") -> None:
        super().__init__(d_model=d_model, num_experts=num_experts, top_k=top_k,
                         d_hidden=d_hidden, gate=gate, gate_kwargs=gate_kwargs,
                         activation=activation)
